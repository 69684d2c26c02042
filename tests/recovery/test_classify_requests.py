"""What a request or an upstream answer is: a reasoning request (its idle timeout doubles),
a context-length error."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.recovery.classify import is_context_length_error, is_reasoning_request


@pytest.mark.parametrize(
    ("body", "model", "reasoning"),
    [
        ({}, "gpt-4o-mini", False),
        ({}, "o3-mini", True),
        ({}, "deepseek-reasoning", True),
        ({"reasoning_effort": "low"}, "gpt-5", True),  # chat
        ({"reasoning": {"effort": "high"}}, "gpt-5", True),  # Responses
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "claude-x", True),  # Messages
        ({"thinking": {"type": "adaptive"}}, "claude-x", True),
        ({"thinking": {"type": "disabled"}}, "claude-x", False),
    ],
)
def test_reasoning_requests_are_told_apart(
    body: dict[str, Any], model: str, reasoning: bool
) -> None:
    assert is_reasoning_request(body, model) is reasoning


def test_context_length_errors_of_openai_and_anthropic_are_told_apart() -> None:
    assert is_context_length_error(b'{"error": {"code": "context_length_exceeded"}}')
    anthropic = b'{"type":"error","error":{"type":"invalid_request_error",'
    assert is_context_length_error(anthropic + b'"message":"prompt is too long: 9000 > 8192"}}')
    assert not is_context_length_error(anthropic + b'"message":"max_tokens: bad"}}')

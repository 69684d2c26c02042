"""Which requests think silently for long stretches (their idle timeout doubles)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.run import is_reasoning_request


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

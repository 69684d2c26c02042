"""What each protocol's request says about the answer it wants: its output budget, and
whether it asks for a document in a schema (ARCHITECTURE.md 6b, rule 4)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.protocols.base import Adapter
from gateway.protocols.chat import ChatAdapter
from gateway.protocols.gemini import GeminiAdapter
from gateway.protocols.messages import MessagesAdapter
from gateway.protocols.responses import ResponsesAdapter

CHAT, RESPONSES, MESSAGES, GEMINI = (
    ChatAdapter(),
    ResponsesAdapter(),
    MessagesAdapter(),
    GeminiAdapter(),
)


@pytest.mark.parametrize(
    ("adapter", "body", "budget", "lowered"),
    [
        (CHAT, {"max_tokens": 50}, 50, {"max_tokens": 7}),
        (CHAT, {"max_completion_tokens": 40}, 40, {"max_completion_tokens": 7}),
        (CHAT, {"max_tokens": 50, "max_completion_tokens": 40}, 40, None),
        (CHAT, {}, None, {}),
        (RESPONSES, {"max_output_tokens": 30}, 30, {"max_output_tokens": 7}),
        (MESSAGES, {"max_tokens": 1024}, 1024, {"max_tokens": 7}),
        (GEMINI, {"generationConfig": {"maxOutputTokens": 20}}, 20, None),
        (GEMINI, {"generationConfig": {"temperature": 0}}, None, None),
    ],
)
def test_the_budget_is_read_and_lowered_in_the_fields_the_client_set(
    adapter: Adapter, body: dict[str, Any], budget: int | None, lowered: dict[str, Any] | None
) -> None:
    assert adapter.budget(body) == budget
    if lowered is not None:
        assert adapter.with_budget(body, 7) == lowered


def test_both_chat_budgets_are_lowered_and_gemini_keeps_its_other_settings() -> None:
    both = CHAT.with_budget({"max_tokens": 50, "max_completion_tokens": 40}, 7)
    assert both == {"max_tokens": 7, "max_completion_tokens": 7}
    config = {"generationConfig": {"maxOutputTokens": 20, "temperature": 0}}
    assert GEMINI.with_budget(config, 7) == {
        "generationConfig": {"maxOutputTokens": 7, "temperature": 0}
    }


@pytest.mark.parametrize(
    ("adapter", "body", "structured"),
    [
        (CHAT, {"response_format": {"type": "json_schema", "json_schema": {}}}, True),
        (CHAT, {"response_format": {"type": "json_object"}}, True),
        (CHAT, {"response_format": {"type": "text"}}, False),
        (CHAT, {}, False),
        (RESPONSES, {"text": {"format": {"type": "json_schema", "schema": {}}}}, True),
        (RESPONSES, {"text": {"format": {"type": "text"}}}, False),
        (MESSAGES, {"output_config": {"format": {"type": "json_schema"}}}, True),
        (MESSAGES, {"output_format": {"type": "json_schema"}}, True),
        (MESSAGES, {"output_config": {"effort": "high"}}, False),
        (GEMINI, {"generationConfig": {"responseMimeType": "application/json"}}, True),
        (GEMINI, {"generationConfig": {"responseSchema": {"type": "OBJECT"}}}, True),
        (GEMINI, {"generationConfig": {"responseMimeType": "text/plain"}}, False),
    ],
)
def test_structured_output_is_recognised_on_every_protocol(
    adapter: Adapter, body: dict[str, Any], structured: bool
) -> None:
    assert adapter.structured(body) is structured


@pytest.mark.parametrize(
    ("adapter", "body", "greedy"),
    [
        (CHAT, {"temperature": 0}, True),
        (CHAT, {"temperature": 0.0}, True),
        (CHAT, {"temperature": 0.7}, False),
        (CHAT, {}, False),  # the provider's default samples
        (MESSAGES, {"temperature": 0}, True),
        (GEMINI, {"generationConfig": {"temperature": 0}}, True),
        (GEMINI, {"temperature": 0}, False),  # not where Gemini reads it
    ],
)
def test_a_greedy_request_is_recognised(
    adapter: Adapter, body: dict[str, Any], greedy: bool
) -> None:
    assert adapter.greedy(body) is greedy

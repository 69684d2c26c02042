from __future__ import annotations

from typing import Any

from gateway.recovery.accumulator import RunAccumulator


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "created": 7,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def test_text_reasoning_and_identity_accumulate() -> None:
    acc = RunAccumulator()
    acc.feed(chunk({"role": "assistant", "content": ""}))
    acc.feed(chunk({"reasoning_content": "think "}))
    acc.feed(chunk({"content": "Hello"}))
    acc.feed(chunk({"content": " 世界"}))
    acc.feed(chunk({}, "stop"))
    acc.feed({"id": "chatcmpl-1", "choices": [], "usage": {"total_tokens": 9}})
    assert (acc.id, acc.created, acc.model, acc.system_fingerprint) == ("chatcmpl-1", 7, "m", "fp")
    assert acc.text == "Hello 世界" and acc.text_chars == 8
    assert acc.reasoning == "think "
    assert acc.finish_reason == "stop"
    assert acc.usage == {"total_tokens": 9}
    assert acc.content_deltas == 3


def test_tool_calls_accumulate_by_index_across_fragments() -> None:
    acc = RunAccumulator()
    acc.feed(
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f"}}
                ]
            }
        )
    )
    acc.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}))
    acc.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}))
    acc.feed(
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "g"}}]}),
    )
    acc.feed(chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}, "tool_calls"))
    completion = acc.to_completion()
    message = completion["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    assert completion["choices"][0]["finish_reason"] == "tool_calls"


def test_other_choices_are_not_mixed_into_choice_zero() -> None:
    acc = RunAccumulator()
    acc.feed({"choices": [{"index": 1, "delta": {"content": "other"}}]})
    acc.feed({"choices": [{"index": 0, "delta": {"content": "mine"}}]})
    assert acc.text == "mine"


def test_openrouter_reasoning_field_is_kept_under_its_own_name() -> None:
    acc = RunAccumulator()
    acc.feed(chunk({"reasoning": "hmm"}))
    acc.feed(chunk({"content": "ok"}, "stop"))
    assert acc.to_completion()["choices"][0]["message"]["reasoning"] == "hmm"

"""The deterministic answer and the fault plan, without sockets."""

from __future__ import annotations

import json

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.chaos import expected_answer, parse_spec
from gateway.chaos.answer import chat_plan, echo_of, script_for
from gateway.chaos.asked import find_prefix
from gateway.chaos.faults import break_stream, fault_cut
from gateway.chaos.render import DONE, IN_BAND_ERRORS, MALFORMED


def _text_of(bodies: list[bytes]) -> str:
    text = ""
    for body in bodies:
        delta = json.loads(b'{"delta":' + body + b"}")["delta"]
        text += delta.get("content") or ""
    return text


def test_answer_is_deterministic_and_depends_on_the_seed() -> None:
    assert expected_answer("chaos") == expected_answer(parse_spec("chaos:text=20,seed=0"))
    assert expected_answer("chaos:seed=1").text != expected_answer("chaos").text


def test_answer_mixes_ascii_cjk_emoji_zwj_and_accents() -> None:
    text = expected_answer("chaos").text
    for sample in ("👩\u200d💻", "你好", "世界", "🌍", "Zürich", "naïve"):
        assert sample in text
    assert not text.startswith(" ")  # like a model's first token


def test_a_longer_answer_starts_like_the_shorter_one() -> None:
    assert expected_answer("chaos:text=40").text.startswith(expected_answer("chaos:text=20").text)


def test_text_deltas_are_words_with_leading_spaces_or_repeating_shapes() -> None:
    script = script_for(parse_spec("chaos:text=30"))
    assert len(script.text_deltas) == 30
    assert all(delta[0] in " \n,.!?;:…" for delta in script.text_deltas[1:])


def test_answers_repeat_words_lines_and_whitespace_like_real_ones() -> None:
    texts = [expected_answer(f"chaos:text=60,seed={seed}").text for seed in range(20)]
    deltas = [
        d for seed in range(20) for d in script_for(parse_spec(f"chaos:seed={seed}")).text_deltas
    ]
    assert any(a == b for a, b in zip(deltas, deltas[1:], strict=False))  # a delta said twice
    assert any("    }\n    }\n" in text for text in texts)  # a repeated line of code
    assert any("        " in text for text in texts)  # a whitespace run
    assert any(" 1, 1, 1," in text for text in texts)


def test_tool_arguments_are_json_only_once_joined() -> None:
    spec = parse_spec("chaos:tools=3,arg_deltas=5,seed=4")
    answer = expected_answer(spec)
    assert answer.finish_reason == "tool_calls"
    assert [call.id for call in answer.tool_calls] == ["call_0_4", "call_1_4", "call_2_4"]
    assert [call.name for call in answer.tool_calls] == ["tool_0", "tool_1", "tool_2"]
    for index, call in enumerate(answer.tool_calls):
        assert json.loads(call.arguments)["k"] == index
    assert any(not call.arguments.isascii() for call in answer.tool_calls)
    script = script_for(spec)
    fragments = [json.loads(b'{"d":' + body + b"}")["d"] for body in script.tool_bodies]
    first_call = [f["tool_calls"][0]["function"]["arguments"] for f in fragments[1:6]]
    assert "".join(first_call) == answer.tool_calls[0].arguments
    assert len(first_call) == 5 and all(first_call)
    for fragment in first_call:
        try:
            json.loads(fragment)
        except json.JSONDecodeError:
            continue
        raise AssertionError(f"fragment {fragment!r} is valid JSON on its own")


@given(st.integers(min_value=0, max_value=10_000))
def test_continuation_plan_resumes_at_any_character(cut: int) -> None:
    script = script_for(parse_spec("chaos:text=25,seed=3"))
    cut %= len(script.text) + 1
    prefix = script.text[:cut]
    plan = chat_plan(script, prefix)
    assert _text_of(plan.bodies) == script.text[cut:]
    assert plan.bodies[-1] == script.finish_body
    assert len(plan.bodies) == len(plan.counts)


def test_find_prefix_recognises_the_three_shapes() -> None:
    text = expected_answer("chaos").text
    prefix = text[:17]
    user = {"role": "user", "content": "hi"}
    assistant = {"role": "assistant", "content": prefix}
    assert find_prefix({"messages": [user, assistant, user]}, text) == prefix
    vllm = {"messages": [user, assistant], "continue_final_message": True}
    assert find_prefix(vllm, text) == prefix
    mistral = {"messages": [user, {**assistant, "prefix": True}]}
    assert find_prefix(mistral, text) == prefix
    parts = {**assistant, "content": [{"type": "text", "text": prefix}]}
    assert find_prefix({"messages": [user, parts, user]}, text) == prefix


def test_find_prefix_ignores_other_conversations() -> None:
    text = expected_answer("chaos").text
    user = {"role": "user", "content": "hi"}
    assert find_prefix({"messages": [user]}, text) == ""
    assert find_prefix({"messages": [user, {"role": "assistant", "content": text[:9]}]}, text) == ""
    not_ours = {"role": "assistant", "content": "something else"}
    assert find_prefix({"messages": [user, not_ours, user]}, text) == ""
    assert find_prefix({"messages": "nope"}, text) == ""


def test_echo_repeats_the_tail_or_the_whole_prefix() -> None:
    assert echo_of(parse_spec("chaos:echo=3"), "abcdef") == "def"
    assert echo_of(parse_spec("chaos:echo=30"), "abcdef") == "abcdef"
    assert echo_of(parse_spec("chaos:echo_prefix=1"), "abcdef") == "abcdef"
    assert echo_of(parse_spec("chaos"), "abcdef") == ""


def test_fault_cut_counts_content_deltas_only() -> None:
    # role, reasoning, text, text, tool header, fragment, finish
    counts = [False, True, True, True, False, True, False]
    assert fault_cut(counts, 0) == 1
    assert fault_cut(counts, 1) == 2
    assert fault_cut(counts, 3) == 4
    assert fault_cut(counts, 4) == 6
    assert fault_cut(counts, 99) == 6
    assert fault_cut(counts, None) == 3  # half of four
    assert fault_cut([False, False], 5) == 1


def test_break_stream_sends_what_each_fault_says() -> None:
    payloads = [b"role", b"a", b"b", b"finish"]
    usage, finish_error = [b"usage"], b"finish-error"

    def broken(fault: str | None, done: bool = True) -> tuple[list[bytes], str]:
        return break_stream(fault, 2, payloads, usage, done, finish_error)

    assert broken(None) == ([*payloads, b"usage", DONE], "end")
    assert broken(None, done=False) == ([*payloads, b"usage"], "end")
    assert broken("malformed") == (
        [b"role", b"a", MALFORMED, b"b", b"finish", b"usage", DONE],
        "end",
    )
    assert broken("error") == ([b"role", b"a", IN_BAND_ERRORS["error"]], "end")
    assert broken("error_done") == ([b"role", b"a", IN_BAND_ERRORS["error"], DONE], "end")
    assert broken("error_fatal") == ([b"role", b"a", IN_BAND_ERRORS["error_fatal"]], "end")
    assert broken("finish_error") == ([b"role", b"a", finish_error, DONE], "end")
    assert broken("no_finish") == ([b"role", b"a", DONE], "end")
    assert broken("no_finish", done=False) == ([b"role", b"a"], "end")
    for fault in ("reset", "close", "stall"):
        assert broken(fault) == ([b"role", b"a"], fault)


def test_in_band_errors_have_the_documented_shape() -> None:
    assert orjson.loads(IN_BAND_ERRORS["error"]) == {
        "error": {"message": "upstream overloaded", "type": "server_error", "code": 503}
    }
    fatal = orjson.loads(IN_BAND_ERRORS["error_fatal"])["error"]
    assert (fatal["type"], fatal["code"]) == ("invalid_request_error", "content_policy_violation")


def test_an_answer_after_tool_results_is_answered_in_text_when_continued_too() -> None:
    from gateway.chaos.asked import ends_in_tool_results

    asked = [
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"},
    ]
    partial = {"role": "assistant", "content": "It is"}
    go_on = {"role": "user", "content": "Your previous message was cut off. Continue it."}
    assert ends_in_tool_results({"messages": asked})
    assert ends_in_tool_results({"messages": [*asked, partial]})  # a prefill of the answer
    assert ends_in_tool_results({"messages": [*asked, partial, go_on]})  # prompt mode
    fresh = [{"role": "user", "content": "Hi"}, partial, go_on]
    assert not ends_in_tool_results({"messages": fresh})
    assert not ends_in_tool_results({"messages": asked[:1]})

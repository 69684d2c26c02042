"""``resumable-gateway demo``: run as a new user runs it, and its checks shown to bite."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gateway.chaos import Answer, expected_answer
from gateway.chaos import gemini as chaos_gemini
from gateway.demo import (
    GEMINI,
    MESSAGES,
    RESPONSES,
    SCENARIOS,
    Received,
    Scenario,
    differences,
    gemini_differences,
    messages_differences,
    responses_differences,
    run_demo,
    surfaced_cleanly,
)
from gateway.demo.realmodel import cut_point, problems_of
from gateway.demo.scenes import BEDROCK_SCENE

CLI = str(Path(sys.executable).with_name("resumable-gateway"))

# What the gateway must see and do in each scenario: the cause, and the plan (None: not retried).
EXPECTED = {
    "chaos:text=32,fault=reset,at=12,times=1": ("reset", "continue_text"),
    "chaos:text=32,seed=1,fault=stall,at=18,times=1": ("idle", "continue_text"),
    "chaos:text=32,seed=2,fault=error,at=8,times=1": ("in_band_error", "continue_text"),
    "chaos:text=32,seed=3,fault=no_finish,at=20,times=1": ("truncated", "continue_text"),
    "chaos:text=8,tools=2,arg_deltas=6,seed=4,fault=reset,at=11,times=1": (
        "reset",
        "truncate_before_tool",
    ),
    "chaos:text=32,seed=5,fault=error_fatal,at=10,times=1": ("in_band_error", None),
    "chaos:text=32,seed=6,fault=reset,at=12,times=1": ("reset", "continue_text"),  # Responses
    # Messages: an overloaded_error event, after the thinking and 12 text deltas.
    "chaos:text=32,reasoning=8,tools=1,seed=8,fault=error,at=20,times=1": (
        "in_band_error",
        "continue_text",
    ),
    # Messages, overloaded every time on Anthropic: finished on Bedrock.
    BEDROCK_SCENE: ("in_band_error", "continue_text"),
    # Gemini: Google's raw error object, after the 8 thoughts and 12 text deltas.
    "chaos:text=32,reasoning=8,tools=1,seed=10,fault=error,at=20,times=1": (
        "in_band_error",
        "continue_text",
    ),
}
RESPONSES_SPEC = "chaos:text=32,seed=6,fault=reset,at=12,times=1"
MESSAGES_SPEC = "chaos:text=32,reasoning=8,tools=1,seed=8,fault=error,at=20,times=1"
GEMINI_SPEC = "chaos:text=32,reasoning=8,tools=1,seed=10,fault=error,at=20,times=1"
TOOLS_SPEC = "chaos:text=8,tools=2,arg_deltas=6,seed=4"


REAL_MODEL = "real model"  # the first scene's key in sections()


def sections(output: str) -> dict[str, str]:
    """The report of each scenario, by its chaos spec (the model line, without pacing);
    the real-model scene's by REAL_MODEL."""
    found = {}
    for block in re.split(r"^(?=\d+/\d+  )", output, flags=re.MULTILINE)[1:]:
        if re.match(r"\d+/\d+  A real model: ", block):
            found[REAL_MODEL] = block
            continue
        model = re.search(r"^ +model +(\S+)$", block, flags=re.MULTILINE)
        assert model is not None, block
        found[re.sub(r",pace_ms=\d+", "", model.group(1))] = block
    return found


def test_the_demo_breaks_and_rescues_every_scenario() -> None:
    env = os.environ | {"NO_COLOR": "1", "COLUMNS": "100"}
    result = subprocess.run(
        [CLI, "demo", "--quick"], capture_output=True, text=True, env=env, timeout=90
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    assert "skipped" not in result.stdout  # a dev install (scripts/test's) has all it needs
    reports = sections(result.stdout)
    assert list(reports)[0] == REAL_MODEL and re.match(r"1/11  ", reports[REAL_MODEL])
    assert set(reports) - {REAL_MODEL} == set(EXPECTED) == {s.spec for s in SCENARIOS}

    # The real model: its answer cut mid-sentence, server A killed, finished on server B.
    real = reports[REAL_MODEL]
    flat = " ".join(real.split())
    assert re.search(r"killed server A, with SIGKILL, after \d+ of the answer's \d+ events", flat)
    assert "broke protocol: upstream 'a' broke the HTTP stream mid-way" in flat, real
    assert "rescued continue_text: " in flat, real
    assert "found nobody listening (connect_error); then server B: 1 answered" in flat, real
    assert re.search(r"^ +seam +…\S", real, flags=re.MULTILINE), real
    check = "identical to the unbroken answer, byte for byte, with the same finish_reason: yes"
    assert f"check {check}" in flat, real
    assert "The sky is blue because" in real  # a readable answer, not the chaos upstream's
    for spec, (cause, plan) in EXPECTED.items():
        report = reports[spec]
        upstream = {MESSAGES_SPEC: "chaos-anthropic", BEDROCK_SCENE: "chaos-anthropic"}.get(
            spec, "chaos-gemini" if spec == GEMINI_SPEC else "chaos"
        )
        assert f"broke     {cause}: upstream '{upstream}'" in report, report
        if plan is None:
            assert "handled   not retried" in report, report
            assert "an explicit error, no [DONE], the text so far intact: yes" in report, report
        elif spec not in (RESPONSES_SPEC, MESSAGES_SPEC, BEDROCK_SCENE, GEMINI_SPEC):  # below
            assert f"rescued   {plan}: " in report, report
            assert "check     identical to an unbroken answer: yes" in report, report
    tool_report = reports[f"{TOOLS_SPEC},fault=reset,at=11,times=1"]
    assert tool_report.count("valid JSON") == 2, tool_report
    assert "INVALID" not in tool_report

    # The Responses scene: the openai SDK's client.responses.stream(), rescued at a seam.
    responses = reports[RESPONSES_SPEC]
    flat = " ".join(responses.split())  # the fields wrap
    assert "rescued continue_text: " in flat, responses
    assert "client openai SDK: client.responses.stream(" in flat, responses
    assert re.search(r"sequence_number 0–\d+ without a gap, response id resp_chaos_\d+;", flat)
    assert 'then response.completed (status "completed")' in flat, responses
    assert re.search(r"^ +seam +…\S", responses, flags=re.MULTILINE), responses
    check = "identical to an unbroken answer, one response, sequence_number without a gap: yes"
    assert f"check {check}" in flat, responses

    # The Messages scene: the anthropic SDK's client.messages.stream(), thinking and a tool.
    messages = reports[MESSAGES_SPEC]
    flat = " ".join(messages.split())
    assert "rescued continue_text: " in flat, messages
    assert "client anthropic SDK: client.messages.stream(" in flat, messages
    assert "blocks thinking, text, tool_use (each started and stopped once)" in flat, messages
    assert re.search(r'message id msg_chaos_\d+; then stop_reason "tool_use", message_stop ', flat)
    thinking = len(expected_answer(MESSAGES_SPEC).reasoning)
    assert re.search(rf'thinking ".+" \({thinking} characters, signature sig_\d+_\w+\)', flat)
    assert messages.count("valid JSON") == 1 and "INVALID" not in messages, messages
    assert re.search(r"^ +seam +…\S", messages, flags=re.MULTILINE), messages
    check = "identical to an unbroken answer, every block whole, one message_stop: yes"
    assert f"check {check}" in flat, messages

    # Anthropic overloaded mid-answer, finished on Bedrock: the same checks, two doors.
    bedrock = reports[BEDROCK_SCENE]
    flat = " ".join(bedrock.split())
    assert "rescued continue_text: " in flat, bedrock
    legs = "legs Anthropic (x-api-key, SSE) then Amazon Bedrock (SigV4, AWS event stream)"
    assert legs in flat, bedrock
    assert f"check {check}" in flat, bedrock

    # The Gemini scene: the google-genai SDK's stream, thoughts and a function call, and
    # Google's raw error object that the gateway recovered from.
    gemini = reports[GEMINI_SPEC]
    flat = " ".join(gemini.split())
    assert "rescued continue_text: " in flat, gemini
    assert "client google-genai SDK: client.models.generate_content_stream(" in flat, gemini
    assert re.search(
        r"\d+ chunks \(each with parts: 8 thought, 32 text, 1 function_call\), "
        r'responseId [\w-]+; then finishReason "STOP" on the last chunk ',
        flat,
    ), gemini
    thoughts = len(expected_answer(GEMINI_SPEC).reasoning)
    assert re.search(rf'thoughts ".+" \({thoughts} characters\)', flat), gemini
    assert re.search(r"signature \S+… \(44 characters of base64\) on the function call", flat)
    assert gemini.count("valid JSON") == 1 and "INVALID" not in gemini, gemini
    assert re.search(r"^ +seam +…\S", gemini, flags=re.MULTILINE), gemini
    check = (
        "identical to an unbroken answer, thoughts once, the call whole with its signature, "
        "one finishReason: yes"
    )
    assert f"check {check}" in flat, gemini
    assert "10 streams broke, 10 rescued (a real model's among them)" in result.stdout
    assert "OPENAI_BASE_URL=http://127.0.0.1:8080/v1" in result.stdout


def stream_of(answer: Answer) -> list[str]:
    """The SSE data payloads of an unbroken answer, text and arguments in several deltas."""

    def chunk(delta: dict[str, object], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
        return orjson.dumps(body).decode()

    half = len(answer.text) // 2
    payloads = [chunk({"role": "assistant", "content": ""})]
    payloads += [chunk({"content": answer.text[:half]}), chunk({"content": answer.text[half:]})]
    for index, call in enumerate(answer.tool_calls):
        header = {"index": index, "id": call.id, "type": "function"}
        payloads.append(chunk({"tool_calls": [header | {"function": {"name": call.name}}]}))
        for part in (call.arguments[:5], call.arguments[5:]):
            arguments = {"index": index, "function": {"arguments": part}}
            payloads.append(chunk({"tool_calls": [arguments]}))
    return [*payloads, chunk({}, answer.finish_reason), "[DONE]"]


def received_from(payloads: list[str]) -> Received:
    received = Received()
    for data in payloads:
        received.feed(data)
    return received


def test_the_identity_check_tells_a_different_answer_apart() -> None:
    expected = expected_answer(TOOLS_SPEC)
    assert expected.tool_calls and expected.text
    assert differences(expected, received_from(stream_of(expected))) == []

    wrong_text = dataclasses.replace(expected, text=expected.text[:-1] + "!")
    wrong_call = dataclasses.replace(expected.tool_calls[1], arguments='{"city": "Paris"}')
    wrong_calls = dataclasses.replace(expected, tool_calls=[expected.tool_calls[0], wrong_call])
    broken_json = dataclasses.replace(wrong_call, arguments='{"city": "Par')
    half_call = dataclasses.replace(expected, tool_calls=[expected.tool_calls[0], broken_json])
    for other in (wrong_text, wrong_calls, half_call):
        assert differences(expected, received_from(stream_of(other)))
    assert "not valid JSON" in " ".join(differences(expected, received_from(stream_of(half_call))))

    payloads = stream_of(expected)
    error = orjson.dumps({"error": {"message": "lost", "code": "upstream_interrupted"}}).decode()
    for cut in (payloads[:-1], payloads[:-2] + ["[DONE]"], [*payloads[:-2], error]):
        assert differences(expected, received_from(cut))  # no [DONE] / no finish / an error


def test_the_honest_failure_check_bites() -> None:
    expected = expected_answer("chaos:text=20,seed=5")
    payloads = stream_of(expected)[:2]  # the role and the first half of the text
    error = orjson.dumps({"error": {"message": "refused", "code": "upstream_interrupted"}}).decode()
    assert surfaced_cleanly(expected, received_from([*payloads, error])) == []
    assert surfaced_cleanly(expected, received_from(payloads))  # no error event
    assert surfaced_cleanly(expected, received_from([*payloads, error, "[DONE]"]))
    altered = dataclasses.replace(expected, text="Something else entirely, " + expected.text)
    assert surfaced_cleanly(expected, received_from([*stream_of(altered)[:2], error]))


def responses_received(expected: Answer, **changes: object) -> Received:
    """What the SDK client of the Responses scene gathers from an unbroken answer."""
    received = Received(
        text=expected.text,
        done=True,
        sequence=list(range(40)),
        response_ids={"resp_1"},
        status="completed",
        final_text=expected.text,
    )
    return dataclasses.replace(received, **changes)  # type: ignore[arg-type]


def test_the_responses_check_bites() -> None:
    expected = expected_answer("chaos:text=20,seed=6")
    assert responses_differences(expected, responses_received(expected)) == []
    for changes in (
        {"text": expected.text[:-1]},
        {"sequence": [0, 1, 2, 4]},
        {"sequence": [0, 1, 1, 2]},
        {"response_ids": {"resp_1", "resp_2"}},
        {"status": "failed", "done": False},
        {"final_text": expected.text[:5]},
        {"error": {"message": "lost", "code": "upstream_interrupted"}},
    ):
        assert responses_differences(expected, responses_received(expected, **changes)), changes


def report_without(monkeypatch: pytest.MonkeyPatch, package: str, scene: Scenario) -> str:
    """The quick demo's report of ``scene`` where ``import package`` raises ImportError."""
    monkeypatch.setitem(sys.modules, package, None)
    out = io.StringIO()
    assert run_demo(quick=True, out=out, scenarios=(scene,), real_model=False) == 0
    return out.getvalue()


@pytest.mark.parametrize(
    ("api", "needs", "package"),
    [(RESPONSES, "", "openai"), (MESSAGES, "", "anthropic"), (MESSAGES, "botocore", "botocore")],
    ids=["responses-without-openai", "messages-without-anthropic", "bedrock-without-botocore"],
)
def test_a_scene_is_skipped_without_the_package_it_needs(
    monkeypatch: pytest.MonkeyPatch, api: str, needs: str, package: str
) -> None:
    (scene,) = [s for s in SCENARIOS if s.api == api and s.needs == needs]
    report = report_without(monkeypatch, package, scene)
    assert f"skipped   the {package} package is not installed" in report
    assert "streams broke" not in report and f"1 skipped: the {package} package" in report


def messages_received(expected: Answer, **changes: object) -> Received:
    """What the SDK client of the Messages scene gathers from an unbroken answer."""
    calls = {
        2 + i: {"id": c.id, "name": c.name, "arguments": c.arguments}
        for i, c in enumerate(expected.tool_calls)
    }
    received = Received(
        text=expected.text,
        calls=calls,
        finish_reasons=["tool_use"],
        done=True,
        response_ids={"msg_1"},
        final_text=expected.text,
        blocks=["thinking", "text", "tool_use"],
        started=[0, 1, 2],
        stopped=[0, 1, 2],
        thinking=expected.reasoning,
        signature="sig_1",
        stops=1,
    )
    return dataclasses.replace(received, **changes)  # type: ignore[arg-type]


def test_the_messages_check_bites() -> None:
    expected = expected_answer("chaos:text=20,reasoning=5,tools=1,seed=8")
    assert messages_differences(expected, messages_received(expected)) == []
    (call,) = expected.tool_calls
    half_call = {2: {"id": call.id, "name": call.name, "arguments": call.arguments[:-3]}}
    other_call = {2: {"id": call.id, "name": call.name, "arguments": '{"city": "Paris"}'}}
    variants: list[dict[str, object]] = [
        {"text": expected.text[:-1]},
        {"thinking": expected.reasoning[1:]},
        {"signature": ""},
        {"calls": half_call},
        {"calls": other_call},
        {"calls": {}},
        {"blocks": ["thinking", "text", "text", "tool_use"], "started": [0, 1, 2, 3]},
        {"stopped": [0, 2]},  # the text block never stopped
        {"started": [0, 1, 1, 2]},
        {"response_ids": {"msg_1", "msg_2"}},
        {"finish_reasons": ["tool_use", "end_turn"]},
        {"finish_reasons": []},
        {"stops": 2},
        {"stops": 0, "done": False},
        {"final_text": expected.text[:5]},
        {"error": {"message": "Overloaded", "code": "overloaded_error"}},
    ]
    for changes in variants:
        assert messages_differences(expected, messages_received(expected, **changes)), changes


def gemini_received(expected: Answer, **changes: object) -> Received:
    """What the SDK client of the Gemini scene gathers from an unbroken answer: its
    thoughts, text and call in chunks of one part, the last finishing, the call signed
    as the upstream's Gemini door signs it."""
    (call,) = expected.tool_calls
    part = {"functionCall": {"name": call.name, "args": orjson.loads(call.arguments)}}
    received = Received(
        text=expected.text,
        calls={0: {"id": "", "name": call.name, "arguments": call.arguments}},
        finish_reasons=["STOP"],
        done=True,
        response_ids={"r1"},
        thinking=expected.reasoning,
        signature=chaos_gemini.thought_signature(chaos_gemini.DEVELOPER, part),
        chunks=[["thought"]] * 3 + [["text"]] * 4 + [["function_call"]],
        signed=["function_call"],
        finished=[7],
    )
    return dataclasses.replace(received, **changes)  # type: ignore[arg-type]


def test_the_gemini_check_bites() -> None:
    expected = expected_answer("chaos:text=20,reasoning=5,tools=1,seed=10")
    assert gemini_differences(expected, gemini_received(expected)) == []
    (call,) = expected.tool_calls
    whole = {"id": "", "name": call.name, "arguments": call.arguments}
    other_call = {0: whole | {"arguments": '{"city": "Paris"}'}}
    twice = {0: whole, 1: whole}  # the call shown again
    vertex = chaos_gemini.thought_signature(
        chaos_gemini.VERTEX,
        {"functionCall": {"name": call.name, "args": orjson.loads(call.arguments)}},
    )
    variants: list[dict[str, object]] = [
        {"text": expected.text[:-1]},
        {"thinking": expected.reasoning + expected.reasoning[:3]},  # thoughts shown again
        {"calls": other_call},
        {"calls": twice},
        {"calls": {}},
        {
            "chunks": [["thought"], ["text"], ["thought"], ["thought"]]
            + [["text"]] * 3
            + [["function_call"]]
        },
        {"chunks": [["thought"]] * 3 + [["text"]] * 3 + [[], ["function_call"]]},
        {"response_ids": {"r1", "r2"}},
        {"finish_reasons": ["STOP", "STOP"], "finished": [6, 7]},
        {"finish_reasons": [], "finished": []},
        {"finished": [6]},  # not on the last chunk
        {"signed": []},
        {"signed": ["text", "function_call"]},
        {"signature": vertex},  # another provider's signature: not the one that came
        {"signature": ""},
        {"error": {"message": "The model is overloaded.", "code": "UNAVAILABLE"}},
    ]
    for changes in variants:
        assert gemini_differences(expected, gemini_received(expected, **changes)), changes


def test_the_gemini_scene_is_skipped_without_the_google_genai_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (scene,) = [s for s in SCENARIOS if s.api == GEMINI]
    report = report_without(monkeypatch, "google.genai", scene)
    assert (
        "skipped   the google-genai package is not installed (scripts/install --demo, or pip "
        "install google-genai)" in " ".join(report.split("\n               "))
    )
    assert "streams broke" not in report and "1 skipped: the google-genai package" in report


def test_a_stream_that_cannot_be_rescued_fails_the_demo() -> None:
    # No times=: every attempt resets, so the retry budget runs out and the answer is lost.
    hopeless = Scenario("Every attempt resets", "chaos:text=10,fault=reset,at=3")
    out = io.StringIO()
    assert run_demo(quick=True, out=out, scenarios=(hopeless,), real_model=False) == 1
    report = out.getvalue()
    assert "identical to an unbroken answer: no" in report
    assert "1 of 1 scenarios failed" in report


def test_the_real_model_scene_is_skipped_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REALMODEL_GGUF", str(tmp_path / "absent.gguf"))
    out = io.StringIO()
    assert run_demo(quick=True, out=out, scenarios=()) == 0
    report = " ".join(out.getvalue().split())
    assert "1/1 A real model: SmolLM2-135M-Instruct" in report
    assert f"skipped SmolLM2-135M's GGUF is not in {tmp_path}" in report
    assert "(scripts/install --demo)" in report and "1 skipped: " in report
    assert "streams broke" not in report


def test_the_cut_falls_mid_sentence_from_the_middle_of_the_answer() -> None:
    deltas = ("", "One", " two", " three", ".", " Four", " five", ".", " Six", ".", "")
    cut = cut_point(deltas)
    assert cut == 6  # the middle (event 5) ends a sentence: the next event, after a word
    assert "".join(deltas[:cut]) == "One two three. Four"
    # A text of finished sentences only: the middle, as the probe would cut it.
    assert cut_point(("", "A.", " B.", " C.", "")) == 2


def test_the_real_model_check_bites() -> None:
    text = "The sky is blue because of Rayleigh scattering."

    def received(**changes: object) -> Received:
        whole = Received(text=text, finish_reasons=["stop"], done=True)
        return dataclasses.replace(whole, **changes)  # type: ignore[arg-type]

    assert problems_of(text, "stop", received(), exact=True) == []
    for changes in (
        {"text": text[:-1]},
        {"text": text + " Again."},
        {"finish_reasons": ["length"]},
        {"finish_reasons": ["stop", "stop"]},
        {"done": False},
        {"error": {"message": "lost", "code": "upstream_interrupted"}},
    ):
        assert problems_of(text, "stop", received(**changes), exact=True), changes
    assert problems_of(text, "stop", received(), exact=False)  # the probe's comparison says so

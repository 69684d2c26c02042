"""What the demo checks: what broke and how it was rescued (from the gateway's metrics
and the upstream's records), and whether each answer is the unbroken one."""

from __future__ import annotations

import os
from dataclasses import dataclass

import orjson
from prometheus_client import Counter

from gateway.chaos import (
    Answer,
    RecordedRequest,
    gemini,
)
from gateway.chaos.asked import find_prefix
from gateway.chaos.messages import messages_prefix
from gateway.demo.client import Received
from gateway.metrics import Metrics

Tally = dict[str, dict[tuple[str, ...], float]]


def _values(counter: Counter) -> dict[tuple[str, ...], float]:
    """A counter's values by label values (in label-name order)."""
    return {
        tuple(sample.labels.values()): sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def tally(metrics: Metrics) -> Tally:
    return {
        "interruptions": _values(metrics.interruptions),  # (upstream, cause)
        "recoveries": _values(metrics.recoveries),  # (plan, outcome)
        "trimmed": _values(metrics.seam_trimmed),  # ()
    }


def _increase(before: Tally, after: Tally, name: str) -> dict[tuple[str, ...], int]:
    old = before[name]
    grown = {k: round(v - old.get(k, 0.0)) for k, v in after[name].items()}
    return {k: n for k, n in grown.items() if n > 0}


@dataclass(frozen=True)
class Rescue:
    """What broke and what the gateway did about it, during one scenario."""

    interruptions: list[tuple[str, str]]  # (upstream, cause), one per break
    recoveries: list[tuple[str, str]]  # (plan, outcome), one per recovery
    trimmed: int  # characters a continuation repeated, trimmed at the seam
    requests: int  # upstream requests the answer took
    # For each request after the first: the characters of text it continued (0: a restart).
    resumed_at: list[int]


def _prefix(request: RecordedRequest, text: str) -> str:
    """The text a request continued: on /v1/messages a trailing assistant message (a
    prefill) is continued too, and on the Gemini API a trailing model turn."""
    if request.path == "/v1/messages":
        prefix = messages_prefix(request.body)
        return prefix if text.startswith(prefix) else ""
    if request.path.endswith(":" + gemini.STREAM):
        prefix = messages_prefix(gemini.chat_view(gemini.contents_of(request.body)))
        return prefix if text.startswith(prefix) else ""
    return find_prefix(request.body, text)


def rescue_of(
    before: Tally, after: Tally, requests: list[RecordedRequest], answer: Answer
) -> Rescue:
    prefixes = [len(_prefix(r, answer.text)) for r in requests if isinstance(r.body, dict)]
    return rescue_between(before, after, len(requests), prefixes[1:])


def rescue_between(before: Tally, after: Tally, requests: int, resumed_at: list[int]) -> Rescue:
    """What the metrics say broke and was done between two tallies, the requests and
    their prefixes told by the caller (who saw them)."""

    def listed(name: str) -> list[tuple[str, str]]:
        return [(k[0], k[1]) for k, n in _increase(before, after, name).items() for _ in range(n)]

    return Rescue(
        interruptions=listed("interruptions"),
        recoveries=listed("recoveries"),
        trimmed=sum(_increase(before, after, "trimmed").values()),
        requests=requests,
        resumed_at=resumed_at,
    )


@dataclass(frozen=True)
class Outcome:
    """How one scene went."""

    broke: bool  # the gateway saw the fault
    passed: bool  # the client got what it should have
    skipped: bool = False  # not run: what it needs is not installed
    why: str = ""  # why it was skipped ("the openai package is not installed")
    rescuable: bool = True  # its fault is one the gateway should rescue


# -- the checks ------------------------------------------------------------------------


def valid_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _text_problems(expected: Answer, received: Received) -> list[str]:
    """What every scene checks first: the stream ended well, with the exact text."""
    problems = []
    if received.error is not None:
        problems.append(f"the stream ended with an error: {received.error.get('message')}")
    if received.text != expected.text:
        agree = len(os.path.commonprefix([received.text, expected.text]))
        problems.append(
            f"the text differs from character {agree} on ({len(received.text)} characters "
            f"received, {len(expected.text)} expected)"
        )
    return problems


def differences(expected: Answer, received: Received) -> list[str]:
    """How ``received`` differs from an unbroken answer; empty when byte-identical."""
    problems = _text_problems(expected, received)
    if received.tool_calls != expected.tool_calls:
        problems.append("the tool calls differ")
    problems += [
        f"{call.name}'s arguments are not valid JSON"
        for call in received.tool_calls
        if not valid_json(call.arguments)
    ]
    if received.finish_reasons != [expected.finish_reason]:
        problems.append(
            f"finish_reason {received.finish_reasons}, not [{expected.finish_reason!r}]"
        )
    if not received.done:
        problems.append("no [DONE]")
    return problems


def responses_differences(expected: Answer, received: Received) -> list[str]:
    """How a Responses stream differs from an unbroken answer; empty when it does not.

    The text, whole and exact; one response id; ``sequence_number`` 0, 1, 2… with no
    gap or repeat; a ``response.completed`` whose output text is the streamed text.
    """
    problems = _text_problems(expected, received)
    if received.sequence != list(range(len(received.sequence))):
        problems.append("sequence_number has a gap or a repeat")
    if len(received.response_ids) != 1:
        problems.append(f"{len(received.response_ids)} response ids, not one")
    if not received.done or received.status != "completed":
        problems.append(f"no response.completed (status {received.status!r})")
    if received.final_text != received.text:
        problems.append("the final response's output_text is not the streamed text")
    return problems


def messages_differences(expected: Answer, received: Received) -> list[str]:
    """How a Messages stream differs from an unbroken answer; empty when it does not.

    The text and the thinking, whole and exact; the thinking signed; the tool calls
    whole (their input parsed); one message id; each block (thinking, text, tool_use)
    started and stopped once, indexes 0, 1, 2…; one message_delta with the stop
    reason, one message_stop; the SDK's final message saying the streamed text.
    """
    problems = _text_problems(expected, received)
    if received.thinking != expected.reasoning:
        problems.append("the thinking differs")
    if expected.reasoning and not received.signature:
        problems.append("the thinking has no signature")
    want = [(c.id, c.name, orjson.loads(c.arguments)) for c in expected.tool_calls]
    try:
        got = [(c.id, c.name, orjson.loads(c.arguments)) for c in received.tool_calls]
    except orjson.JSONDecodeError:
        got = []
    if got != want:
        problems.append("the tool calls differ")
    blocks = ["thinking"] * bool(expected.reasoning) + ["text"] * bool(expected.text)
    blocks += ["tool_use"] * len(expected.tool_calls)
    if received.blocks != blocks:
        problems.append(f"blocks {received.blocks}, not {blocks}")
    indexes = list(range(len(received.blocks)))
    if received.started != indexes or received.stopped != indexes:
        problems.append(
            f"blocks started {received.started} and stopped {received.stopped}, "
            f"not each of {indexes} once"
        )
    if len(received.response_ids) != 1:
        problems.append(f"{len(received.response_ids)} message ids, not one")
    stop_reason = "tool_use" if expected.tool_calls else "end_turn"
    if received.finish_reasons != [stop_reason]:
        problems.append(f"stop_reason {received.finish_reasons}, not [{stop_reason!r}]")
    if received.stops != 1:
        problems.append(f"{received.stops} message_stop events, not one")
    if received.final_text != received.text:
        problems.append("the final message's text is not the streamed text")
    return problems


def _runs(kinds: list[str]) -> list[str]:
    """``kinds`` with each run of one kind said once: the order the parts came in."""
    return [kind for index, kind in enumerate(kinds) if index == 0 or kinds[index - 1] != kind]


def gemini_differences(expected: Answer, received: Received) -> list[str]:
    """How a Gemini stream differs from an unbroken answer; empty when it does not.

    The text and the thoughts, whole and exact, thoughts first; the function calls whole
    and once; content parts in every chunk (the SDK's chat history drops a turn with a
    chunk without them); one responseId; one finishReason, STOP, on the last chunk; the
    thoughtSignature on the first call (or, without calls, the last text part) and
    nowhere else, as the upstream made it (Gemini 3 refuses the next turn otherwise).
    """
    problems = _text_problems(expected, received)
    if received.thinking != expected.reasoning:
        problems.append("the thoughts differ")
    want = [(c.name, orjson.loads(c.arguments)) for c in expected.tool_calls]
    got = [(c.name, orjson.loads(c.arguments)) for c in received.tool_calls]
    if got != want:
        problems.append("the function calls differ")
    order = ["thought"] * bool(expected.reasoning) + ["text"] * bool(expected.text)
    order += ["function_call"] * bool(expected.tool_calls)
    came = _runs([kind for kinds in received.chunks for kind in kinds])
    if came != order:
        problems.append(f"the parts came as {came}, not {order}")
    if empty := [index for index, kinds in enumerate(received.chunks) if not kinds]:
        problems.append(f"chunks {empty} have no content parts")
    if len(received.response_ids) != 1:
        problems.append(f"{len(received.response_ids)} responseIds, not one")
    if received.finish_reasons != ["STOP"] or received.finished != [len(received.chunks) - 1]:
        problems.append(
            f"finishReason {received.finish_reasons} on chunks {received.finished}, not "
            f"['STOP'] on the last one"
        )
    signed = "function_call" if expected.tool_calls else "text"
    if received.signed != [signed]:
        problems.append(f"thoughtSignature on the parts {received.signed}, not [{signed!r}]")
    elif expected.tool_calls and not _signed_by_upstream(received):
        problems.append("the call's thoughtSignature is not the one the upstream made for it")
    return problems


def _signed_by_upstream(received: Received) -> bool:
    """Whether the first call's signature is one the chaos upstream's Gemini door
    issued for that call: relayed unchanged, on the part it came on."""
    if not received.tool_calls:
        return False
    call = received.tool_calls[0]
    part = {
        "functionCall": {"name": call.name, "args": orjson.loads(call.arguments)},
        "thoughtSignature": received.signature,
    }
    return gemini.signature_valid(gemini.DEVELOPER, part)


def surfaced_cleanly(expected: Answer, received: Received) -> list[str]:
    """How an unrescuable stream failed to end honestly; empty when it did.

    Honestly: an in-band error event, no ``finish_reason``, no ``[DONE]``, and the text
    the client has is the start of the answer, unaltered.
    """
    problems = []
    if received.error is None:
        problems.append("no error event")
    if received.finish_reasons:
        problems.append(f"finish_reason {received.finish_reasons} on a broken answer")
    if received.done:
        problems.append("[DONE] after a broken answer")
    if not received.text or not expected.text.startswith(received.text):
        problems.append("the text received is not the start of the answer")
    return problems


# -- the report ------------------------------------------------------------------------

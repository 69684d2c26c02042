"""The soak's pure half: random chaos specs, what a client assembled, and the verdict on it.

No processes, no sockets: ``probes.soak`` runs the streams and calls these. The
expected answer always comes from ``gateway.chaos.expected_answer(spec)``, the
one definition of what an uninterrupted answer to a spec is.

A verdict has an outcome and a list of defects. Outcomes:

- ``exact``: the text, reasoning, tool calls, finish_reason and usage chunk of an
  uninterrupted answer;
- ``tools_cut``: exact text, the first tool calls only, whole, and
  ``finish_reason: tool_calls``: the SynthesizeToolUse plan (ARCHITECTURE.md
  section 4) when the stream broke after a tool call was complete; by design;
- ``error``: ended with an error (an in-band error event, which the SDK raises
  as ``APIError``, or an HTTP error on a resume), and what it had is a clean
  beginning of the answer;
- ``timed_out``: the client gave up waiting (a defect: the stream hung);
- ``defective``: anything with a defect.

Defects (a stream may have several):

- ``lost``: the text is a subsequence of the expected one, missing characters
  (for a stream that ended with an error: missing characters before its end);
- ``duplicated``: the text has characters the expected one does not have there;
- ``silently_wrong``: ended with a finish_reason and no error, yet the text, the
  tool calls or the finish_reason differ: the worst case, it looks like success;
- ``missing_usage``: ``include_usage`` was asked and the stream completed, yet
  it carried no usage chunk or more than one;
- ``broken_tool_json``: a tool call whose arguments are not valid JSON, or whose
  id, name or arguments differ from the expected call at its index;
- ``contract``: another break of the stream contract (ARCHITECTURE.md section 2):
  no role or more than one, more than one finish_reason or completion id, tool
  call indices with a gap, reasoning that is not a beginning of the expected
  reasoning, or a stream that ended with neither a finish_reason nor an error;
- ``timed_out``: see above.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletionChunk

from gateway.chaos import Answer, expected_answer
from gateway.chaos.spec import STREAM_FAULTS as CHAOS_STREAM_FAULTS

# Every mid-stream fault the chaos upstream has but the fatal one (never recovered), in
# a fixed order: the specs a seed draws must not change between runs or commits.
STREAM_FAULTS = (
    "reset",
    "close",
    "stall",
    "error",
    "error_done",
    "finish_error",
    "no_finish",
    "malformed",
)
assert set(STREAM_FAULTS) == CHAOS_STREAM_FAULTS - {"error_fatal"}
ARG_DELTAS = 4  # the chaos default: argument fragments per tool call

OUTCOMES = ("exact", "tools_cut", "error", "timed_out", "defective")
DEFECTS = (
    "lost",
    "duplicated",
    "silently_wrong",
    "missing_usage",
    "broken_tool_json",
    "contract",
    "timed_out",
)
ACCEPTABLE = frozenset({"exact", "tools_cut", "error"})


# -- specs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecChoices:
    """How often each shape and variant is drawn."""

    tools: float = 0.3  # share of streams with 1..3 tool calls
    reasoning: float = 0.25  # share with reasoning deltas before the text
    no_fault: float = 0.05  # share with no fault at all (the control group)
    twice: float = 0.4  # share of faulted streams faulted twice (times=2)
    split: float = 0.25  # share chunked at random byte boundaries (split=BYTES)
    lineend: float = 0.1  # share with CRLF or CR line endings
    among_tools: float = 0.5  # share of tool answers faulted among the calls' deltas
    pace_ms: tuple[int, int] = (4, 16)  # milliseconds between deltas
    stall_s: tuple[float, float] = (0.2, 2.5)  # how long a stall fault stays silent


def random_spec(rng: random.Random, seed: int, choices: SpecChoices = SpecChoices()) -> str:
    """One random chaos spec; ``seed`` must differ per stream (``times=`` counts by spec)."""
    text = rng.randint(5, 120)
    pairs: list[tuple[str, object]] = [("text", text)]
    reasoning = rng.randint(3, 30) if rng.random() < choices.reasoning else 0
    if reasoning:
        pairs.append(("reasoning", reasoning))
    tools = rng.randint(1, 3) if rng.random() < choices.tools else 0
    if tools:
        pairs.append(("tools", tools))
    pairs += [("seed", seed), ("usage", 1), ("pace_ms", rng.randint(*choices.pace_ms))]
    if rng.random() >= choices.no_fault:
        fault = rng.choice(STREAM_FAULTS)
        content = text + reasoning + tools * ARG_DELTAS  # deltas ``at=`` counts
        # Half the tool answers are cut among their calls: the plans that keep them.
        low = text + reasoning if tools and rng.random() < choices.among_tools else 0
        pairs += [("fault", fault), ("at", rng.randint(low, content))]
        pairs.append(("times", 2 if rng.random() < choices.twice else 1))
        if fault == "stall":
            pairs.append(("stall_s", round(rng.uniform(*choices.stall_s), 1)))
    if rng.random() < choices.split:
        pairs.append(("split", rng.randint(2, 96)))
    if rng.random() < choices.lineend:
        pairs.append(("lineend", rng.choice(("crlf", "cr"))))
    return "chaos:" + ",".join(f"{key}={value}" for key, value in pairs)


def spec_fault(spec: str) -> str:
    """The fault a spec names, ``none`` if it names none (for grouping results)."""
    for pair in spec.removeprefix("chaos:").split(","):
        key, _, value = pair.partition("=")
        if key == "fault":
            return value
    return "none"


# -- what the client assembled ------------------------------------------------------------


@dataclass
class Received:
    """What an openai SDK client received, over every connection of one stream."""

    text: str = ""
    reasoning: str = ""
    roles: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    usage: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0  # what ``x-resume-from`` says on a resume

    def feed(self, chunk: ChatCompletionChunk) -> None:
        self.chunks += 1
        self.ids.add(chunk.id)
        if chunk.usage is not None:
            self.usage.append(chunk.usage.model_dump())
        for choice in chunk.choices:
            delta = choice.delta
            if delta.role:
                self.roles.append(delta.role)
            self.text += delta.content or ""
            extra = delta.model_extra or {}
            self.reasoning += extra.get("reasoning_content") or extra.get("reasoning") or ""
            for call in delta.tool_calls or []:
                slot = self.tool_calls.setdefault(call.index, {"id": None, "name": "", "args": ""})
                if call.id:
                    slot["id"] = call.id
                if call.function and call.function.name:
                    slot["name"] += call.function.name
                if call.function and call.function.arguments:
                    slot["args"] += call.function.arguments
            if choice.finish_reason:
                self.finish_reasons.append(choice.finish_reason)


# -- the verdict ------------------------------------------------------------------------


@dataclass
class Verdict:
    outcome: str
    defects: list[str]
    notes: list[str]  # what is wrong, in words, for the report


def is_subsequence(short: str, long: str) -> bool:
    """Whether ``short`` is ``long`` with some characters left out."""
    position = 0
    for char in short:
        position = long.find(char, position)
        if position < 0:
            return False
        position += 1
    return True


def first_difference(got: str, expected: str) -> int:
    for index, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            return index
    return min(len(got), len(expected))


def around(text: str, index: int, width: int = 30) -> str:
    return text[max(0, index - width) : index + width]


def _text_defect(got: str, expected: str, ended: bool) -> str | None:
    """``lost``/``duplicated`` or None; a stream that did not end may stop anywhere."""
    if got == expected or (not ended and expected.startswith(got)):
        return None
    if is_subsequence(got, expected):
        return "lost"
    return "duplicated"


def _tool_defects(received: Received, answer: Answer) -> tuple[list[str], list[str]]:
    """(broken calls, contract notes) of the tool calls received, by index."""
    broken, contract = [], []
    indices = sorted(received.tool_calls)
    if indices != list(range(len(indices))):
        contract.append(f"tool call indices {indices}")
    for index in indices:
        call = received.tool_calls[index]
        try:
            arguments = json.loads(call["args"])
        except ValueError:
            broken.append(f"tool call {index}: arguments are not JSON: {call['args'][:80]!r}")
            continue
        if index >= len(answer.tool_calls):
            broken.append(f"tool call {index}: not in the answer ({call['name']})")
            continue
        want = answer.tool_calls[index]
        if (call["id"], call["name"]) != (want.id, want.name) or arguments != json.loads(
            want.arguments
        ):
            broken.append(
                f"tool call {index}: got {call['id']} {call['name']} {call['args'][:80]!r}, "
                f"expected {want.id} {want.name} {want.arguments[:80]!r}"
            )
    return broken, contract


def classify(spec: str, received: Received, error: str | None, timed_out: bool) -> Verdict:
    """Compare what the client assembled with ``expected_answer(spec)``."""
    answer = expected_answer(spec)
    defects: list[str] = []
    notes: list[str] = []
    ended = error is None and not timed_out  # the stream ended by itself, without an error

    text = _text_defect(received.text, answer.text, ended)
    if text is not None:
        at = first_difference(received.text, answer.text)
        defects.append(text)
        notes.append(
            f"text {text}: {len(received.text)} of {len(answer.text)} characters; first "
            f"difference at {at}: got {around(received.text, at)!r}, "
            f"expected {around(answer.text, at)!r}"
        )
    broken, contract = _tool_defects(received, answer)
    if broken:
        defects.append("broken_tool_json")
        notes += broken

    tools_cut = False
    if ended:
        if not received.finish_reasons:
            contract.append("ended with neither a finish_reason nor an error")
        else:
            got_calls = len(received.tool_calls)
            tools_cut = (
                answer.finish_reason == "tool_calls"
                and received.finish_reasons == ["tool_calls"]
                and 1 <= got_calls < len(answer.tool_calls)
            )
            wrong = []
            if received.finish_reasons[-1] != answer.finish_reason:
                wrong.append(
                    f"finish_reason {received.finish_reasons[-1]!r}, "
                    f"expected {answer.finish_reason!r}"
                )
            if received.text != answer.text:
                wrong.append("text differs")
            if broken or (got_calls != len(answer.tool_calls) and not tools_cut):
                wrong.append(f"{got_calls} tool calls, expected {len(answer.tool_calls)}")
            if wrong:
                defects.append("silently_wrong")
                notes.append("ended as a success, but: " + "; ".join(wrong))
            if len(received.usage) != 1:
                defects.append("missing_usage")
                notes.append(f"{len(received.usage)} usage chunks, expected 1")
    if received.roles != ["assistant"] and (ended or len(received.roles) > 1):
        contract.append(f"roles {received.roles}")
    if len(received.finish_reasons) > 1:
        contract.append(f"finish_reasons {received.finish_reasons}")
    if len(received.ids) > 1:
        contract.append(f"{len(received.ids)} completion ids")
    if not answer.reasoning.startswith(received.reasoning):
        at = first_difference(received.reasoning, answer.reasoning)
        contract.append(
            f"reasoning is not a beginning of the expected one at {at}: "
            f"got {around(received.reasoning, at)!r}"
        )
    if contract:
        defects.append("contract")
        notes += contract
    if timed_out:
        defects.append("timed_out")
        notes.append("timed out")

    if timed_out:
        outcome = "timed_out"
    elif [d for d in defects if d != "timed_out"]:
        outcome = "defective"
    elif error is not None:
        outcome = "error"
    elif tools_cut:
        outcome = "tools_cut"
    else:
        outcome = "exact"
    return Verdict(outcome, defects, notes)

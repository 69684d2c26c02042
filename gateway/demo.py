"""``resumable-gateway demo``: broken streams arriving whole, in a minute, without an API key.

Starts the chaos upstream (``gateway.chaos``) and a gateway in front of it, in this
process on free loopback ports, with in-memory state. Then it streams a few answers
that the upstream breaks on purpose (a reset, a stall, an error event, a truncated
body, a half-written tool call, and one error that must not be retried) and prints,
for each: the text as the client receives it, live; what broke (the gateway's
interruption metrics); how it was rescued (its recovery metrics, and the
continuation request the upstream recorded); and whether the answer is
byte-identical to an unbroken one (``expected_answer``).

The client is plain httpx + httpx-sse, as someone without the openai package would
write it: content and tool-call deltas, ``finish_reason``, an in-band
``{"error": ...}`` event, ``[DONE]``. One more scene speaks the Responses API
(``POST /v1/responses``) through the openai SDK's ``client.responses.stream()``,
which checks the event order strictly, and one the Anthropic Messages API
(``POST /v1/messages``, an ``anthropic`` upstream on the same chaos server) through
the anthropic SDK's ``client.messages.stream()``, with extended thinking and a
tool. Each is skipped, with a note, when its SDK is not installed (both are
development dependencies).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import shutil
import sys
import textwrap
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx
import orjson
from httpx_sse import connect_sse
from prometheus_client import Counter

from gateway.app import create_app
from gateway.chaos import (
    Answer,
    ChaosUpstream,
    RecordedRequest,
    ToolCall,
    expected_answer,
    running_chaos_upstream,
)
from gateway.chaos.answer import find_prefix
from gateway.chaos.messages import messages_prefix
from gateway.config import GatewayConfig, parse_config
from gateway.metrics import Metrics
from gateway.recovery.classify import DESCRIPTIONS, Cause
from gateway.serve import in_thread

IDLE_TIMEOUT = 1.0  # seconds without a byte before the gateway calls a stream stalled
PACE_MS = 35  # between the upstream's deltas, so the answers arrive as a model's would


CHAT, RESPONSES, MESSAGES = "chat", "responses", "messages"


@dataclass(frozen=True)
class Scenario:
    title: str  # what breaks, and where
    spec: str  # the chaos model name, without pacing; times=1: only the first request breaks
    rescuable: bool = True
    # Chat completions (httpx), the Responses API (the openai SDK), or the Anthropic
    # Messages API (the anthropic SDK).
    api: str = CHAT


SCENARIOS = (
    Scenario(
        "Connection reset (TCP RST) after 12 of 32 text deltas",
        "chaos:text=32,fault=reset,at=12,times=1",
    ),
    Scenario(
        f"The upstream goes silent after 18 of 32 text deltas (idle timeout: {IDLE_TIMEOUT:g} s)",
        "chaos:text=32,seed=1,fault=stall,at=18,times=1",
    ),
    Scenario(
        "An in-band error event (503, upstream overloaded) after 8 of 32 text deltas; "
        "the continuation repeats the last words it was asked to quote back",
        "chaos:text=32,seed=2,fault=error,at=8,times=1",
    ),
    Scenario(
        "The body ends with [DONE] but without a finish_reason after 20 of 32 text deltas "
        "(a silent truncation)",
        "chaos:text=32,seed=3,fault=no_finish,at=20,times=1",
    ),
    Scenario(
        "Connection reset after 8 text deltas, while tool_0's JSON arguments are half-written "
        "(3 of 6 fragments)",
        "chaos:text=8,tools=2,arg_deltas=6,seed=4,fault=reset,at=11,times=1",
    ),
    Scenario(
        "A content-policy error event after 10 of 32 text deltas: not transient, so not retried",
        "chaos:text=32,seed=5,fault=error_fatal,at=10,times=1",
        rescuable=False,
    ),
    Scenario(
        "The Responses API, through the openai SDK's client.responses.stream(): connection "
        "reset after 12 of 32 text deltas",
        "chaos:text=32,seed=6,fault=reset,at=12,times=1",
        api=RESPONSES,
    ),
    Scenario(
        "The Anthropic Messages API, through the anthropic SDK's client.messages.stream(), "
        "with extended thinking and a tool: an overloaded_error event after the thinking and "
        "12 of 32 text deltas",
        "chaos:text=32,reasoning=8,tools=1,seed=8,fault=error,at=20,times=1",
        api=MESSAGES,
    ),
)


# -- the servers ---------------------------------------------------------------------


def demo_config(upstream_url: str) -> GatewayConfig:
    """The chaos upstream twice (its OpenAI APIs, and its Messages API as an ``anthropic``
    upstream), short timeouts and a short retry backoff, quiet logs, memory state."""
    retry = {"retries": 2, "backoff_initial": 0.05, "backoff_max": 0.2, "idle_retry_delay": 0}
    timeouts = {"connect": 2, "first_byte": 5, "idle": IDLE_TIMEOUT}
    data = {
        "upstreams": [
            {"name": "chaos", "base_url": upstream_url, "timeouts": timeouts},
            {
                "name": "chaos-anthropic",
                "kind": "anthropic",
                # As the anthropic SDK takes it: the server's root, without /v1.
                "base_url": upstream_url.removesuffix("/v1"),
                "timeouts": timeouts,
            },
        ],
        # A request takes the first route that serves its API: /v1/messages the first,
        # the rest (and requests without a model) the second.
        "routes": [
            {"match": "*", "upstream": "chaos-anthropic", "retry": retry},
            {"match": "*", "upstream": "chaos", "retry": retry},
        ],
        "logging": {"level": "error"},
    }
    return parse_config(data, "demo config")


@contextlib.contextmanager
def running_gateway(config: GatewayConfig, metrics: Metrics) -> Iterator[str]:
    """Serve the gateway in a daemon thread on a free port; yield its /v1 URL."""
    with in_thread(create_app(config, metrics)) as url:
        yield url + "/v1"


# -- the client ----------------------------------------------------------------------


@dataclass
class Received:
    """What the client got, assembled from the stream's events as an SDK would."""

    text: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> id, name, arguments
    finish_reasons: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    done: bool = False  # [DONE]; for the Responses API, a response.completed event
    longest_pause: float = 0.0  # seconds between two events: where the stream was rescued
    # The Responses API only: every event's sequence_number, the response ids the events
    # named, the terminal status, and the output text of the SDK's final response.
    sequence: list[int] = field(default_factory=list)
    response_ids: set[str] = field(default_factory=set)
    status: str | None = None
    final_text: str | None = None
    # The Messages API only: each content block's type as it started, the indexes that
    # started and stopped, the thinking and its signature, and the message_stop events.
    # (Its message ids go in response_ids, its stop reasons in finish_reasons.)
    blocks: list[str] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    thinking: str = ""
    signature: str = ""
    stops: int = 0

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]

    def feed(self, data: str) -> str:
        """Take one SSE data payload; return the text it adds."""
        if data == "[DONE]":
            self.done = True
            return ""
        event = orjson.loads(data)
        if "error" in event:
            self.error = event["error"]
            return ""
        text = ""
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish_reasons.append(choice["finish_reason"])
        self.text += text
        return text

    def _tool_delta(self, delta: dict[str, Any]) -> None:
        call = self.calls.setdefault(delta["index"], {"id": "", "name": "", "arguments": ""})
        function = delta.get("function") or {}
        call["id"] += delta.get("id") or ""
        call["name"] += function.get("name") or ""
        call["arguments"] += function.get("arguments") or ""


def stream_answer(
    client: httpx.Client, base_url: str, model: str, show: Callable[[str], None]
) -> Received:
    """Stream one chat completion through the gateway; ``show`` each text delta as it comes."""
    received = Received()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me how streams survive failure."}],
        "stream": True,
    }
    headers = {"content-type": "application/json"}
    url = base_url + "/chat/completions"
    with connect_sse(client, "POST", url, content=orjson.dumps(body), headers=headers) as source:
        response = source.response
        if response.status_code != 200:
            response.read()
            received.error = {"message": f"HTTP {response.status_code}: {response.text[:300]}"}
            return received
        last: float | None = None
        for event in source.iter_sse():
            now = time.perf_counter()
            if last is not None:
                received.longest_pause = max(received.longest_pause, now - last)
            last = now
            if event.data:
                show(received.feed(event.data))
    return received


def stream_response(base_url: str, model: str, show: Callable[[str], None]) -> Received:
    """Stream one Responses API answer with the openai SDK; ``show`` each text delta.

    ``client.responses.stream()`` checks the event order as it goes (one response
    identity, every item added before its events and done before the end); what it
    raises is the stream's error.
    """
    from openai import APIError, OpenAI

    received = Received()
    prompt = "Tell me how streams survive failure."
    with OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30.0) as client:
        try:
            with client.responses.stream(model=model, input=prompt) as events:
                last: float | None = None
                for event in events:
                    now = time.perf_counter()
                    if last is not None:
                        received.longest_pause = max(received.longest_pause, now - last)
                    last = now
                    received.sequence.append(event.sequence_number)
                    response = getattr(event, "response", None)
                    if response is not None:
                        received.response_ids.add(response.id)
                        received.status = response.status
                    if event.type == "response.output_text.delta":
                        received.text += event.delta
                        show(event.delta)
                    elif event.type == "response.completed":
                        received.done = True
                final = events.get_final_response()
                received.final_text = final.output_text
        except APIError as exc:
            received.error = {"message": exc.message, "code": getattr(exc, "code", None)}
        except RuntimeError as exc:  # the SDK's own checks of the event order
            received.error = {"message": str(exc), "code": "sdk_check"}
    return received


MESSAGES_PROMPT = "Tell me how streams survive failure, then look up the weather."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def stream_message(base_url: str, model: str, show: Callable[[str], None]) -> Received:
    """Stream one Messages API answer with the anthropic SDK; ``show`` each text delta.

    Extended thinking on and a tool offered, as an agent asks. ``client.messages.stream()``
    assembles the message as it goes (and raises on an event out of order); an
    ``event: error`` is raised as an ``APIStatusError``.
    """
    from anthropic import Anthropic, APIError

    received = Received()
    with Anthropic(
        base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=30.0
    ) as client:
        try:
            with client.messages.stream(
                model=model,
                max_tokens=4096,
                thinking={"type": "enabled", "budget_tokens": 1024},
                tools=[WEATHER_TOOL],  # type: ignore[list-item]
                messages=[{"role": "user", "content": MESSAGES_PROMPT}],
            ) as events:
                last: float | None = None
                for event in events:
                    now = time.perf_counter()
                    if last is not None:
                        received.longest_pause = max(received.longest_pause, now - last)
                    last = now
                    _message_event(received, event, show)
                final = events.get_final_message()
                received.final_text = "".join(b.text for b in final.content if b.type == "text")
        except APIError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body.get("error")
            code = error.get("type") if isinstance(error, dict) else None
            received.error = {"message": exc.message, "code": code}
        except (RuntimeError, ValueError) as exc:  # the SDK's own checks of the events
            received.error = {"message": str(exc), "code": "sdk_check"}
    return received


def _message_event(received: Received, event: Any, show: Callable[[str], None]) -> None:
    """Note one event of the anthropic SDK's message stream in ``received``."""
    if event.type == "message_start":
        received.response_ids.add(event.message.id)
    elif event.type == "content_block_start":
        received.started.append(event.index)
        received.blocks.append(event.content_block.type)
    elif event.type == "text":
        received.text += event.text
        show(event.text)
    elif event.type == "thinking":
        received.thinking += event.thinking
    elif event.type == "signature":
        received.signature = event.signature
    elif event.type == "content_block_stop":
        received.stopped.append(event.index)
        block = event.content_block
        if block.type == "tool_use":
            arguments = orjson.dumps(block.input).decode()
            received.calls[event.index] = {
                "id": block.id,
                "name": block.name,
                "arguments": arguments,
            }
    elif event.type == "message_delta":
        received.finish_reasons.append(event.delta.stop_reason)
    elif event.type == "message_stop":
        received.stops += 1
        received.done = True


# -- the evidence: the gateway's metrics, the upstream's recorded requests ---------------

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
    prefill) is continued too."""
    if request.path == "/v1/messages":
        prefix = messages_prefix(request.body)
        return prefix if text.startswith(prefix) else ""
    return find_prefix(request.body, text)


def rescue_of(
    before: Tally, after: Tally, requests: list[RecordedRequest], answer: Answer
) -> Rescue:
    def listed(name: str) -> list[tuple[str, str]]:
        return [(k[0], k[1]) for k, n in _increase(before, after, name).items() for _ in range(n)]

    prefixes = [len(_prefix(r, answer.text)) for r in requests if isinstance(r.body, dict)]
    return Rescue(
        interruptions=listed("interruptions"),
        recoveries=listed("recoveries"),
        trimmed=sum(_increase(before, after, "trimmed").values()),
        requests=len(requests),
        resumed_at=prefixes[1:],
    )


# -- the checks ------------------------------------------------------------------------


def _valid_json(text: str) -> bool:
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
        if not _valid_json(call.arguments)
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

_PIECES = re.compile(r"\s*\S+|\s+")
LABEL = 10  # width of a field's label


def _width(text: str) -> int:
    """Terminal columns, roughly: wide East Asian characters and emoji take two."""
    total = 0
    for char in text:
        if unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        total += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return total


class Style:
    """ANSI colour, only when writing to a terminal (and ``NO_COLOR`` is not set)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text


class Report:
    def __init__(self, out: TextIO, style: Style) -> None:
        self.out = out
        self.style = style
        self.width = min(shutil.get_terminal_size((100, 24)).columns, 100) - 1
        self.indent = " " * (5 + LABEL)
        self._column = 0

    def paragraph(self, text: str, indent: str = "", code: str = "") -> None:
        pieces = textwrap.wrap(text, self.width, subsequent_indent=indent, break_on_hyphens=False)
        for piece in pieces:
            self.line(self.style(piece, code) if code else piece)

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def field(self, label: str, text: str) -> None:
        first = "     " + self.style(label.ljust(LABEL), "2")
        wrapped = textwrap.wrap(
            text,
            self.width - len(self.indent),
            break_long_words=False,
            break_on_hyphens=False,
        )
        for index, piece in enumerate(wrapped or [""]):
            self.line((first if index == 0 else self.indent) + piece)

    def start_live(self, label: str) -> None:
        self.out.write("     " + self.style(label.ljust(LABEL), "2") + self._colour_on())
        self._column = len(self.indent)

    def live(self, text: str) -> None:
        """Write streamed text as it arrives, wrapped under the field indent."""
        for piece in _PIECES.findall(text):
            if self._column > len(self.indent) and self._column + _width(piece) > self.width:
                self.out.write("\n" + self.indent)
                self._column = len(self.indent)
                piece = piece.lstrip()
            self.out.write(piece)
            self._column += _width(piece)
        self.out.flush()

    def end_live(self) -> None:
        self.line("\033[0m" if self.style.enabled else "")

    def _colour_on(self) -> str:
        return "\033[36m" if self.style.enabled else ""

    def verdict(self, question: str, problems: list[str]) -> None:
        answer = self.style("yes", "32;1") if not problems else self.style("no", "31;1")
        self.field("check", f"{question}: {answer}")
        for problem in problems:
            self.field("", "- " + problem)


def _quote(text: str) -> str:
    return orjson.dumps(text).decode()


def _received_line(received: Received, seconds: float) -> str:
    parts = [f"{len(received.text)} characters"]
    if received.calls:
        parts.append(f"{len(received.calls)} tool call(s)")
    ending = [f"finish_reason {_quote(r)}" for r in received.finish_reasons]
    if received.error is not None:
        ending.append(f"an error event ({received.error.get('code')})")
    ending.append("[DONE]" if received.done else "no [DONE]")
    return f"{', '.join(parts)}, then {', '.join(ending)}  ({seconds:.1f} s)"


def _responses_received_line(received: Received, seconds: float) -> str:
    parts = [f"{len(received.text)} characters in {len(received.sequence)} events"]
    if received.sequence:
        gapless = received.sequence == list(range(len(received.sequence)))
        numbers = f"sequence_number {received.sequence[0]}–{received.sequence[-1]}"
        parts.append(numbers + (" without a gap" if gapless else " WITH A GAP OR REPEAT"))
    if received.response_ids:
        ids = ", ".join(sorted(received.response_ids))
        parts.append(f"response id {ids}" if len(received.response_ids) == 1 else f"ids {ids}")
    if received.error is not None:
        ending = f"an error ({received.error.get('code')})"
    elif received.done:
        ending = f"response.completed (status {_quote(received.status or '')})"
    else:
        ending = "no terminal event"
    return f"{', '.join(parts)}; then {ending}  ({seconds:.1f} s)"


def _messages_received_line(received: Received, seconds: float) -> str:
    blocks = ", ".join(received.blocks) or "none"
    whole = received.started == received.stopped == list(range(len(received.blocks)))
    parts = [
        f"{len(received.text)} characters",
        f"blocks {blocks} ({'each started and stopped once' if whole else 'NOT EACH WHOLE'})",
    ]
    if received.response_ids:
        ids = ", ".join(sorted(received.response_ids))
        parts.append(f"message id {ids}" if len(received.response_ids) == 1 else f"ids {ids}")
    ending = [f"stop_reason {_quote(r)}" for r in received.finish_reasons]
    if received.error is not None:
        ending.append(f"an error ({received.error.get('code')})")
    ending.append(f"{received.stops} message_stop" if received.stops != 1 else "message_stop")
    return f"{', '.join(parts)}; then {', '.join(ending)}  ({seconds:.1f} s)"


def _thinking_line(received: Received) -> str:
    shown = received.thinking if len(received.thinking) <= 40 else received.thinking[:39] + "…"
    signed = f"signature {received.signature}" if received.signature else "NOT SIGNED"
    return f"{_quote(shown)}  ({len(received.thinking)} characters, {signed})"


def _broke_line(rescue: Rescue, received: Received) -> str:
    if not rescue.interruptions:
        return "nothing (the fault did not reach the gateway)"
    lines = []
    for index, (upstream, cause) in enumerate(rescue.interruptions):
        try:
            what = DESCRIPTIONS[Cause(cause)]
        except ValueError:
            what = "broke"
        # The request that followed a break says how far the client had got; after the
        # last one, if the stream ended in an error, the client's text does.
        if index < len(rescue.resumed_at):
            chars = rescue.resumed_at[index]
        else:
            chars = len(received.text) if received.error is not None else 0
        into = f", {chars} characters into the answer" if chars else ""
        lines.append(f"{cause}: upstream {upstream!r} {what}{into}")
    return "; then ".join(lines)


_PLANS = {
    "continue_text": "asked the upstream to continue the text the client already had (sent "
    "as the assistant's prefix)",
    "truncate_before_tool": "held back the half-written tool call (the client never saw it) and "
    "asked the upstream to continue the text; the calls came again, whole",
    "whole_restart": "nothing had reached the client yet: sent the same request again",
    "synthesize_tool_use": "finished with the tool calls already complete, without asking again",
}


def _rescued_line(rescue: Rescue, received: Received) -> str:
    if not rescue.recoveries:
        return (
            "not retried: the error is not transient, so the client is told, in-band, "
            "instead of getting an answer that looks complete"
        )
    steps = []
    for (plan, outcome), group in itertools.groupby(rescue.recoveries):
        times = len(list(group))
        steps.append(
            plan
            + (f" ×{times}" if times > 1 else "")
            + ("" if outcome == "recovered" else f", {outcome}")
            + f": {_PLANS.get(plan, 'recovered')}"
        )
    return (
        "; ".join(steps)
        + f". {rescue.requests} upstream requests in all; the longest wait between two events "
        f"at the client: {received.longest_pause:.2f} s"
    )


def _seam_line(text: str, at: int) -> str:
    """Where a continuation joins the text: the characters either side of ``at``."""
    before, after = text[max(0, at - 24) : at], text[at : at + 24]
    return f"…{_quote(before)} ‖ " + (_quote(after) + "…" if after else "the tool calls")


def _tool_line(call: ToolCall) -> str:
    valid = "valid JSON" if _valid_json(call.arguments) else "INVALID JSON"
    return f"{call.name}({call.arguments})  {valid}"


# -- the demo ------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """The servers one demo runs against, and its client."""

    upstream: ChaosUpstream
    gateway_url: str
    metrics: Metrics
    client: httpx.Client

    def stream(
        self, model: str, show: Callable[[str], None], api: str = CHAT
    ) -> tuple[Received, Rescue]:
        """Stream one answer; return it with the evidence of what broke and was done."""
        before, seen = tally(self.metrics), len(self.upstream.requests)
        if api == RESPONSES:
            received = stream_response(self.gateway_url, model, show)
        elif api == MESSAGES:
            received = stream_message(self.gateway_url, model, show)
        else:
            received = stream_answer(self.client, self.gateway_url, model, show)
        requests = self.upstream.requests[seen:]
        return received, rescue_of(before, tally(self.metrics), requests, expected_answer(model))


@contextlib.contextmanager
def staged() -> Iterator[Stage]:
    """The chaos upstream and a gateway in front of it, each in a thread; an httpx client."""
    metrics = Metrics()
    logger = logging.getLogger("gateway")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the report says it all
    try:
        with (
            running_chaos_upstream() as upstream,
            running_gateway(demo_config(upstream.base_url), metrics) as gateway_url,
            httpx.Client(timeout=httpx.Timeout(30.0)) as client,
        ):
            yield Stage(upstream, gateway_url, metrics, client)
    finally:
        logger.setLevel(level)


@dataclass(frozen=True)
class Outcome:
    broke: bool  # the gateway saw the fault
    passed: bool  # the client got what it should have
    skipped: bool = False  # not run: its SDK (``missing``) is not installed
    missing: str = ""


def has_openai() -> bool:
    try:
        import openai  # noqa: F401
    except ImportError:
        return False
    return True


def has_anthropic() -> bool:
    try:
        import anthropic  # noqa: F401
    except ImportError:
        return False
    return True


# The SDK scenes: the package each needs, and how the report names its client.
SDKS = {
    RESPONSES: ("openai", has_openai, "openai SDK: client.responses.stream(model=..., input=...)"),
    MESSAGES: (
        "anthropic",
        has_anthropic,
        "anthropic SDK: client.messages.stream(model=..., max_tokens=4096, thinking="
        '{"type": "enabled", "budget_tokens": 1024}, tools=[get_weather], messages=...)',
    ),
}


def run_scenario(
    number: str, scenario: Scenario, stage: Stage, report: Report, pace_ms: int
) -> Outcome:
    model = scenario.spec + (f",pace_ms={pace_ms}" if pace_ms else "")
    expected = expected_answer(scenario.spec)
    report.line()
    report.paragraph(f"{number}  {scenario.title}", indent="     ", code="1")
    report.field("model", model)
    responses, messages = scenario.api == RESPONSES, scenario.api == MESSAGES
    if scenario.api in SDKS:
        package, installed, client = SDKS[scenario.api]
        if not installed():
            why = f"the {package} package is not installed (pip install {package})"
            report.field("skipped", why)
            return Outcome(broke=False, passed=True, skipped=True, missing=package)
        report.field("client", client)
    started = time.perf_counter()
    report.start_live("text" if scenario.api in SDKS else "client")
    try:
        received, rescue = stage.stream(model, report.live, scenario.api)
    finally:
        report.end_live()
    for call in received.tool_calls:
        report.field("", _tool_line(call))
    if messages:
        report.field("thinking", _thinking_line(received))
    seconds = time.perf_counter() - started
    if responses:
        report.field("received", _responses_received_line(received, seconds))
    elif messages:
        report.field("received", _messages_received_line(received, seconds))
    else:
        report.field("received", _received_line(received, seconds))
    if received.error is not None and not scenario.rescuable:
        report.field("error", f"{received.error.get('code')}: {received.error.get('message')}")
    report.field("broke", _broke_line(rescue, received))
    report.field("rescued" if scenario.rescuable else "handled", _rescued_line(rescue, received))
    seams = [_seam_line(received.text, at) for at in rescue.resumed_at if at]
    for seam in seams:
        report.field("seam", seam)
    if rescue.trimmed:
        trimmed = f"{rescue.trimmed} characters the continuation quoted back, cut before the client"
        report.field("trimmed", trimmed)
    if responses:
        problems = responses_differences(expected, received)
        report.verdict(
            "identical to an unbroken answer, one response, sequence_number without a gap",
            problems,
        )
    elif messages:
        problems = messages_differences(expected, received)
        report.verdict(
            "identical to an unbroken answer, every block whole, one message_stop", problems
        )
    elif scenario.rescuable:
        problems = differences(expected, received)
        report.verdict("identical to an unbroken answer", problems)
    else:
        problems = surfaced_cleanly(expected, received)
        report.verdict("an explicit error, no [DONE], the text so far intact", problems)
    return Outcome(broke=bool(rescue.interruptions), passed=not problems)


def _header(report: Report, stage: Stage, count: int) -> None:
    report.paragraph(
        f"resumable-gateway demo: a chaos upstream breaks {count} "
        f"answer{'' if count == 1 else 's'} on purpose, and a "
        "gateway in front of it rescues them. Both run in this process, on loopback: no API "
        "key, no network."
    )
    upstream = stage.upstream.base_url
    report.field("upstream", f"{upstream}  (deterministic answers, faults on request)")
    report.field(
        "gateway",
        f"{stage.gateway_url}  (idle timeout {IDLE_TIMEOUT:g} s, 2 retries, in-memory state)",
    )


def _summary(
    report: Report, scenarios: tuple[Scenario, ...], outcomes: list[Outcome], seconds: float
) -> None:
    pairs = [(s, o) for s, o in zip(scenarios, outcomes, strict=True) if not o.skipped]
    rescuable = [o for s, o in pairs if s.rescuable]
    report.line()
    if not all(o.passed for o in outcomes):
        failed = sum(not o.passed for o in outcomes)
        text = f"{failed} of {len(outcomes)} scenarios failed (see above). ({seconds:.1f} s)"
        report.paragraph(text, code="31;1")
        return
    broken, rescued = sum(o.broke for o in rescuable), sum(o.passed for o in rescuable)
    texts = []
    if rescuable:
        texts.append(
            f"{broken} streams broke, {rescued} rescued: every answer byte-identical to an "
            "unbroken one, 0 characters lost or repeated."
        )
    if refused := len(pairs) - len(rescuable):
        texts.append(
            f"{refused} unrecoverable error ended its stream with an explicit error event."
        )
    for package in sorted({o.missing for o in outcomes if o.skipped}):
        skipped = sum(o.skipped and o.missing == package for o in outcomes)
        texts.append(f"{skipped} skipped: the {package} package is not installed.")
    report.paragraph(f"{' '.join(texts)} ({seconds:.1f} s)", code="32;1")


def _hint(report: Report) -> None:
    report.line()
    report.line(
        "Try it with your own client (any OpenAI or Anthropic SDK; the model name picks the fault):"
    )
    for command in (
        "resumable-gateway chaos-upstream --port 9000 &",
        "GATEWAY_UPSTREAM_BASE_URL=http://127.0.0.1:9000/v1 \\",
        "  GATEWAY_ANTHROPIC_BASE_URL=http://127.0.0.1:9000 resumable-gateway serve &",
        "export OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=unused",
        "export ANTHROPIC_BASE_URL=http://127.0.0.1:8080 ANTHROPIC_API_KEY=unused",
    ):
        report.line("  " + command)
    report.line('  then stream model "chaos:text=40,fault=reset,at=12,times=1,pace_ms=30"')
    report.line("  (times=1: only the first request with that exact name breaks; vary seed=)")
    report.line("  or the same model with client.responses.stream(model=..., input=...)")
    report.line("  or with client.messages.stream(model=..., max_tokens=..., messages=...)")


def run_demo(
    quick: bool = False,
    out: TextIO | None = None,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
) -> int:
    """Run the scenarios and report; 0 when every one behaved as it should, else 1."""
    out = sys.stdout if out is None else out
    report = Report(out, Style(out.isatty() and "NO_COLOR" not in os.environ))
    pace_ms = 0 if quick else PACE_MS
    started = time.perf_counter()
    try:
        with staged() as stage:
            _header(report, stage, len(scenarios))
            outcomes = [
                run_scenario(f"{number}/{len(scenarios)}", scenario, stage, report, pace_ms)
                for number, scenario in enumerate(scenarios, 1)
            ]
    except KeyboardInterrupt:
        report.line("interrupted")
        return 130
    _summary(report, scenarios, outcomes, time.perf_counter() - started)
    _hint(report)
    return 0 if all(o.passed for o in outcomes) else 1

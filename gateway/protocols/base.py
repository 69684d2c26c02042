"""What a wire protocol has to say to the recovery engine (ARCHITECTURE.md sections 2a, 7).

The run engine (``gateway.runs``: the loop, durable runs, resume) and checkpoints
know a protocol only through an ``Adapter``:

- **decode**: an upstream SSE payload as the engine's neutral events (``Chunk``,
  ``InBandError``, ``Done``, ``Malformed``), and what a chunk adds (throughput);
- **render**: a ``ClientStream`` (the splicer) that turns the chunks of one or more
  legs into the client's stream in the protocol's own shape, recording what it sent
  in a ``RunAccumulator``; the terminal events; the assembled non-streaming answer;
- **continue**: the upstream request of a leg, and of a continuation (``SeamRule``);
  the request's constraints a continuation must keep: its output budget (read and
  lowered to what is left) and whether it asks for structured output;
- **replay**: the client's view rebuilt from the events it was sent (a takeover).

Adding a protocol adds an adapter; the loop, the run log and checkpoints stay as they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

from gateway.errors import GatewayError
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.events import Chunk, Event
from gateway.recovery.plan import Plan, Position, Sent
from gateway.recovery.seam import SeamRule
from gateway.upstream.continuation import ContinuationRequest, Continuing, continuation_request


class ClientStream(Protocol):
    """The splicer of one run: upstream chunks in, the client's bytes out."""

    leg: int
    finished: bool

    @property
    def sent(self) -> RunAccumulator:
        """What the client has been sent (the run's accumulator)."""
        ...

    def restore(self, leg: int, in_flight: list[str]) -> None: ...
    def in_flight(self) -> list[str]: ...
    def held_calls(self) -> list[tuple[str, str]]: ...
    def resumable(self) -> Position | None: ...
    @property
    def trimmed(self) -> int: ...
    def seam_outcomes(self) -> list[str]: ...
    def snapshot(self) -> Sent: ...
    def begin_leg(self, plan: Plan, seam: SeamRule | None = None) -> None: ...
    def feed(self, chunk: Chunk) -> bytes | None: ...
    def end_leg(self) -> None: ...
    def synthesize_tool_use(self) -> bytes: ...
    def end_at_budget(self) -> bytes: ...
    def close(self) -> bytes:
        """The end of a successful answer (the answer is finished)."""
        ...

    def fail(self, error: GatewayError) -> bytes:
        """The end of an answer that cannot be completed (section 2 item 6, 2a)."""
        ...


class Adapter(ABC):
    """One wire protocol: ``chat`` (chat completions), ``responses`` or ``messages``."""

    name: ClassVar[str]
    path: ClassVar[str]  # the upstream path, under the upstream's base URL
    # Whether clients name a run by the answer's own id (``identity["id"]``), as
    # ``GET /v1/responses/{id}`` and ``previous_response_id`` do: the run keeps an alias.
    aliased: ClassVar[bool] = False
    turns: ClassVar[str] = "messages"  # the request's conversation (a list of turns)
    # What a client stream silent for a while gets (recovery waits): a comment, or the
    # protocol's own ping event. Never on a stream with ``id:`` lines (section 2 item 7).
    keepalive: ClassVar[bytes] = b": keepalive\n\n"
    # Seconds to wait, after the events before it, before a stream's final error goes out
    # in a write of its own: a client that raises only on an error read alone (Gemini's
    # JS SDK) needs it apart; 0: written as the events come.
    error_pause: ClassVar[float] = 0.0
    # The request's output budget (``max_tokens`` and kin): every field that sets one.
    budget_fields: ClassVar[tuple[str, ...]] = ()
    # The request's structured-output setting: (field, key) of a dict whose ``type``
    # names a document format (chat's ``response_format``, Responses' ``text.format``).
    format_field: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def parse_event(self, data: bytes) -> Event:
        """One SSE ``data:`` payload from the upstream."""

    @abstractmethod
    def delta_chars(self, chunk: Chunk) -> int:
        """Characters a chunk adds to the answer (text, reasoning, arguments)."""

    @abstractmethod
    def answers(self, chunk: Chunk) -> bool:
        """Whether ``chunk`` is part of the answer itself (text, a refusal, tool-call
        arguments), not reasoning: from then on the model is not thinking silently."""

    def thinks(self, chunk: Chunk) -> bool:
        """Whether ``chunk`` starts reasoning again after the answer began (a reasoning
        item, a thinking block): the model may think silently again."""
        return False

    @abstractmethod
    def new_accumulator(self) -> RunAccumulator: ...

    @abstractmethod
    def splicer(self, accumulator: RunAccumulator, body: dict[str, Any]) -> ClientStream:
        """The client stream of a run of ``body`` (the client's request)."""

    @abstractmethod
    def upstream_body(self, body: dict[str, Any], model: str) -> dict[str, Any]:
        """The request a leg sends: always streaming (a non-streaming client's answer
        is assembled by the gateway, with the same recovery)."""

    def in_background(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """``body`` (a leg's request) asked as a background response, which the provider
        goes on generating with no reader and streams again from any event (the
        Responses API's ``background``); None: the protocol has no such thing, or the
        client declined storage (``store: false``)."""
        return None

    def budget(self, body: dict[str, Any]) -> int | None:
        """The most output tokens the client's request allows (None: it sets no limit)."""
        limits = [body.get(name) for name in self.budget_fields]
        counts = [n for n in limits if type(n) is int and n > 0]
        return min(counts) if counts else None

    def with_budget(self, body: dict[str, Any], tokens: int) -> dict[str, Any]:
        """``body`` asking for at most ``tokens`` output tokens (what is left of the
        client's budget after the legs before): in each field the client set."""
        return body | {name: tokens for name in self.budget_fields if name in body}

    def structured(self, body: dict[str, Any]) -> bool:
        """Whether the request asks for a JSON document (a schema, or JSON mode)."""
        value: Any = body
        for name in self.format_field:
            value = value.get(name) if isinstance(value, dict) else None
        return isinstance(value, dict) and value.get("type") in ("json_schema", "json_object")

    def greedy(self, body: dict[str, Any]) -> bool:
        """Whether the request asks for greedy decoding (``temperature: 0``): the model's
        one answer, which only a literal prefill or a replay can finish exactly."""
        temperature = body.get("temperature")
        return type(temperature) in (int, float) and temperature == 0

    def for_continuation(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as a continuation starts from (its ``turns`` a list)."""
        return body

    def continuation(
        self, body: dict[str, Any], sent: RunAccumulator, how: Continuing
    ) -> ContinuationRequest | None:
        """The request that continues the text the client was ``sent``, as the leg
        continues (``how``), or None: the upstream cannot."""
        return continuation_request(
            self.for_continuation(body),
            how.mode,
            sent.text,
            how.prompt,
            anchored=how.anchored,
            turns=self.turns,
        )

    @abstractmethod
    def assemble(self, accumulator: RunAccumulator) -> dict[str, Any]:
        """The non-streaming answer, from what the splicer recorded."""

    @abstractmethod
    def replay(self, events: list[bytes]) -> RunAccumulator:
        """What a client assembled from ``events`` (the stored log of a run)."""

    @abstractmethod
    def is_terminal(self, event: bytes) -> bool:
        """An event nothing follows: success or failure."""

    @abstractmethod
    def succeeded(self, event: bytes) -> bool:
        """A terminal event that ends a complete answer."""

    @abstractmethod
    def error_event(self, error: GatewayError, events: int) -> bytes:
        """An error that ends a stream of ``events`` events, outside any splicer
        (a replica that shuts down or lost the run)."""

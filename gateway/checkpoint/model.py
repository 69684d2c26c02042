"""What a checkpoint holds, and how a run's client view is rebuilt from it.

A run is stored as three parts, all keyed by the run id:

- the **record**, written once: who owns the run (a keyed hash of the credential,
  never the credential), the route, and the original request body (credentials
  travel in headers, which are never stored);
- the **event log**: every SSE event the client was sent, numbered from 1. It is
  the ground truth of what the client has, and appended to, never rewritten, so
  a checkpoint costs what changed since the last one, not the whole answer;
- the **state**: a small snapshot beside the log (leg, usage per leg, the tool
  call in flight with its partial arguments, offsets delivered, timestamps),
  replaced at every checkpoint.

Text, reasoning and completed tool calls are not stored twice: ``replay`` rebuilds
them from the log, exactly as the client assembled them.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.recovery.accumulator import REASONING_FIELDS, RunAccumulator, ToolCall

Status = Literal["running", "done", "failed", "detached"]
FINAL_STATUSES = frozenset({"done", "failed"})
DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    owner: str  # owner_hash(key, credential)
    route: str
    body: dict[str, Any]
    created: float  # unix time

    def encode(self) -> bytes:
        return orjson.dumps(self)  # orjson encodes dataclasses natively, fast

    @classmethod
    def decode(cls, raw: bytes) -> RunRecord:
        return cls(**orjson.loads(raw))


@dataclass(frozen=True, slots=True)
class InFlightCall:
    """A tool call begun and not complete: never sent to the client."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class RunState:
    seq: int  # client events covered by this checkpoint
    status: Status
    leg: int  # route leg relaying the run
    splice_leg: int  # upstream responses spliced so far, minus one
    usage_by_leg: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: list[InFlightCall] = field(default_factory=list)
    text_chars: int = 0  # offsets delivered to the client
    reasoning_chars: int = 0
    tool_calls: int = 0
    cause: str | None = None  # the last interruption, if any
    updated: float = 0.0  # unix time

    def encode(self) -> bytes:
        return orjson.dumps(self)  # orjson encodes dataclasses natively, fast

    @classmethod
    def decode(cls, raw: bytes) -> RunState:
        data = orjson.loads(raw)
        data["in_flight"] = [InFlightCall(**call) for call in data.get("in_flight", [])]
        return cls(**data)


@dataclass(slots=True)
class Checkpoint:
    """A run as loaded from a store."""

    record: RunRecord
    state: RunState
    events: list[bytes]  # the client's events 1..n; n may exceed state.seq

    @property
    def finished(self) -> bool:
        return bool(self.events) and is_terminal(self.events[-1])

    def accumulator(self) -> RunAccumulator:
        """The client's view at the end of the stored log, with usage from the state."""
        accumulator = replay(self.events)
        for leg, usage in self.state.usage_by_leg.items():
            accumulator.set_usage(int(leg), usage)
        return accumulator


@dataclass(frozen=True, slots=True)
class Flush:
    """One run's part of a store write: what changed since its last checkpoint."""

    run_id: str
    first_seq: int  # number of events[0]
    events: bytes  # SSE events first_seq..last_seq, concatenated
    last_seq: int
    state: bytes  # RunState, encoded
    record: bytes | None = None  # RunRecord, encoded: first write, or a rewrite
    reset: bool = False  # drop the stored log first (a rewrite after an outage)
    expire: bool = False  # (re)set the TTL of the record and log: first and last writes
    ttl: float = 3600.0  # seconds the run's keys live after this write
    lease: str | None = None  # replica holding the run; None releases the lease
    lease_ttl: float = 5.0
    # The writer's claim on the run (0: it started the run; ``store.claim`` gives the
    # next): the store applies the flush only while this is the run's current epoch.
    epoch: int = 0


class Applied(enum.IntEnum):
    """What a store did with one run's flush."""

    WRITTEN = 0
    WATCHED = 1  # written, and a replica tails the run: checkpoint every event
    # Refused: another replica claimed the run after this writer's lease lapsed (a
    # pause past lease_ttl), so this writer's checkpoints would overwrite the new owner's.
    FENCED = 2


def owner_hash(key: bytes, credential: str | None) -> str:
    """A keyed hash of the credential that started a run: comparable, not reversible."""
    return hmac.new(key, (credential or "").encode(), hashlib.sha256).hexdigest()


def split_events(data: bytes) -> list[bytes]:
    """SSE events as the gateway writes them: ``data: …`` lines, each ending in a blank line."""
    return [part + b"\n\n" for part in data.split(b"\n\n") if part]


def is_terminal(event: bytes) -> bool:
    """``[DONE]`` or an in-band error event: nothing follows it."""
    return event == DONE_EVENT or event.startswith(b'data: {"error"')


def replay(events: list[bytes]) -> RunAccumulator:
    """Rebuild what the client assembled from the events it was sent."""
    accumulator = RunAccumulator()
    for event in events:
        payload = event.removeprefix(b"data: ").rstrip(b"\n")
        if payload == b"[DONE]":
            continue
        chunk = orjson.loads(payload)
        if not isinstance(chunk, dict) or "error" in chunk:
            continue
        if accumulator.identity is None:
            accumulator.identity = {
                k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint")
            }
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("role") and accumulator.role is None:
                accumulator.role = delta["role"]
            for name in REASONING_FIELDS:
                if delta.get(name):
                    accumulator.add_reasoning(name, delta[name])
            if delta.get("content"):
                accumulator.add_text(delta["content"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                accumulator.tool_calls.append(
                    ToolCall(
                        len(accumulator.tool_calls),
                        call.get("id") or f"call_{len(accumulator.tool_calls)}",
                        function.get("name") or "",
                        function.get("arguments") or "",
                        call.get("type") or "function",
                    )
                )
            if choice.get("finish_reason"):
                accumulator.finish_reason = choice["finish_reason"]
    return accumulator

"""What a checkpoint holds, and how a run's client view is rebuilt from it.

A run is stored as three parts, all keyed by the run id:

- the **record**, written once: who owns the run (a keyed hash of the credential,
  never the credential), the route, and the original request body and query string
  (credentials travel in headers, which are never stored);
- the **event log**: every SSE event the client was sent, numbered from 1. It is
  the ground truth of what the client has, and appended to, never rewritten, so
  a checkpoint costs what changed since the last one, not the whole answer;
- the **state**: a small snapshot beside the log (leg, usage per leg, the tool
  call in flight with its partial arguments, offsets delivered, timestamps),
  replaced at every checkpoint.

Text, reasoning and completed tool calls are not stored twice: the protocol's
adapter (``gateway.protocols``, named in the record) rebuilds them from the log,
exactly as the client assembled them (``Adapter.replay``).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import orjson

Status = Literal["running", "done", "failed", "detached"]
FINAL_STATUSES = frozenset({"done", "failed"})


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    owner: str  # owner_hash(key, credential)
    route: str
    body: dict[str, Any]
    created: float  # unix time
    protocol: str = "chat"  # the adapter that speaks the run's wire protocol
    query: str = ""  # the client's query string, which every leg's request carries
    fallbacks: list[str] | None = None  # the request's ``fallbacks`` field, if it had one
    trace: str | None = None  # the run span's W3C traceparent, when traced: a takeover links it

    def encode(self) -> bytes:
        return orjson.dumps(self)  # orjson encodes dataclasses natively, fast

    @classmethod
    def decode(cls, raw: bytes) -> RunRecord:
        return cls(**_known(cls, orjson.loads(raw)))


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
    # Legs that broke before they reported usage: what they are estimated to cost.
    estimated_by_leg: dict[str, dict[str, int]] = field(default_factory=dict)
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
        data = _known(cls, orjson.loads(raw))
        data["in_flight"] = [InFlightCall(**call) for call in data.get("in_flight", [])]
        return cls(**data)


@dataclass(slots=True)
class Checkpoint:
    """A run as loaded from a store."""

    record: RunRecord
    state: RunState
    events: list[bytes]  # the client's events 1..n; n may exceed state.seq


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
    # Not written: the part of the store holding the run could not be reached (a
    # Cluster primary down, its slots not failed over yet) while the rest could.
    FAILED = 3
    # Written on the primary, but no replica acknowledged it within the wait (Redis
    # WAIT timed out): a failover may lose it. Whether a replica tails the run is not
    # known from such a write (it is learned again from the next).
    UNREPLICATED = 4


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the fields ``cls`` does not have: a record or state a later
    version wrote (a rolling update) is read by this one."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def owner_hash(key: bytes, credential: str | None) -> str:
    """A keyed hash of the credential that started a run: comparable, not reversible."""
    return hmac.new(key, (credential or "").encode(), hashlib.sha256).hexdigest()


def split_events(data: bytes) -> list[bytes]:
    """SSE events as the gateway writes them: ``data: …`` lines, each ending in a blank line."""
    return [part + b"\n\n" for part in data.split(b"\n\n") if part]

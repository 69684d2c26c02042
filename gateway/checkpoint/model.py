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

Records and states carry their **format** (``version``, ``FORMAT``), because replicas
of two releases share one store while a Deployment rolls. The format is raised only
by a change an older reader would misread (a field whose meaning changes, one it
cannot do without removed); adding a field does not raise it. So every reader reads
the previous release's records and the next release's: fields it does not know are
ignored, fields missing are defaulted (``None``, ``0``, empty), and a record without
``version`` (every release before formats were numbered) is format 1. A record of a
format newer than ``FORMAT``, or one whose fields have the wrong types, is refused
with ``RunUnreadable`` (503, ``run_unreadable``), logged, never half-read: a replica of
the release that wrote it can resume the run. docs/operations.md, "Upgrading".
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.errors import ServiceUnavailable

Status = Literal["running", "done", "failed", "detached"]
FINAL_STATUSES = frozenset({"done", "failed"})

# The record format this release writes and the newest it reads. Raise it only for a
# change the previous release would misread, and then write the old format for one
# release more (docs/operations.md, "Upgrading"); a new field never raises it.
FORMAT = 1

logger = logging.getLogger("gateway.checkpoint")


class RunUnreadable(ServiceUnavailable):
    """A stored run this replica's release cannot continue: a record format or a
    protocol it does not know (a later release wrote it), or fields of the wrong type.
    A replica of the release that wrote it can; retrying may reach one."""

    code = "run_unreadable"


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
    version: int = FORMAT  # the record's format (absent: 1)

    def encode(self) -> bytes:
        return orjson.dumps(self)  # orjson encodes dataclasses natively, fast

    @classmethod
    def decode(cls, raw: bytes) -> RunRecord:
        """A record of this format, the previous or the next (unknown fields ignored,
        missing ones defaulted); ``RunUnreadable`` for a newer format or wrong types."""
        data = _read("record", raw, _RECORD)
        return cls(**data)


@dataclass(frozen=True, slots=True)
class InFlightCall:
    """A tool call begun and not complete: never sent to the client."""

    name: str = ""  # read as "unnamed tool" by a takeover
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class RunState:
    seq: int  # client events covered by this checkpoint
    status: Status
    leg: int  # route leg relaying the run
    splice_leg: int  # upstream responses spliced so far, minus one
    usage_by_leg: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Legs that broke before they reported usage: what they are estimated to cost.
    estimated_by_leg: dict[str, dict[str, int]] = field(default_factory=dict)
    # Output tokens the legs so far produced (``RunAccumulator.output_spent``): what a
    # takeover's continuation takes off the client's budget. None: an older release's.
    output_spent: int | None = None
    in_flight: list[InFlightCall] = field(default_factory=list)
    text_chars: int = 0  # offsets delivered to the client
    reasoning_chars: int = 0
    tool_calls: int = 0
    cause: str | None = None  # the last interruption, if any
    updated: float = 0.0  # unix time
    version: int = FORMAT  # the state's format (absent: 1)
    # Events a replica acknowledged before this checkpoint (durability sync: the rest may
    # be lost to a failover, so a tail does not give them out yet); None: not said (a
    # release before it, or nothing waited for), every event of ``seq``.
    acked: int | None = None
    # The first leg's upstream response, where it is a background one still generating:
    # a takeover reads it again (``Run.restore``) before any other plan. None: not one.
    background: str | None = None

    def released(self) -> int:
        """The events a client following the run from the store may have: acknowledged
        ones, or all of a run that ended."""
        if self.acked is None or self.status in FINAL_STATUSES:
            return self.seq
        return self.acked

    def encode(self) -> bytes:
        return orjson.dumps(self)  # orjson encodes dataclasses natively, fast

    @classmethod
    def decode(cls, raw: bytes) -> RunState:
        """As ``RunRecord.decode``; the calls in flight read as tolerantly."""
        data = _read("state", raw, _STATE)
        data["in_flight"] = [
            InFlightCall(**_fields("state.in_flight", call, _CALL)) for call in data["in_flight"]
        ]
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
    # Not written: the store's log of the run ends before the flush's first event (a
    # failover lost what the writer had, or released without an acknowledgement): the
    # run is to be rewritten whole. A log is never stored with a gap, so a position in
    # it always names the event the client has at that position.
    GAP = 5


# -- reading any release's records -------------------------------------------------------
#
# Each stored field: a check of its JSON value and its default when missing or null
# (``_REQUIRED``: a record without it cannot be continued). Fields not listed (a later
# release's) are ignored. A field added to a dataclass above is added here too (a test
# compares them).

_REQUIRED: Any = object()


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def _is_object(value: Any) -> bool:
    return isinstance(value, dict)


def _is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _by_leg(value: Any) -> bool:
    """``{"<leg number>": {...}}``: usage, or estimates, per leg."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and k.isascii() and k.isdigit() and isinstance(v, dict)
        for k, v in value.items()
    )


def _is_list(value: Any) -> bool:
    return isinstance(value, list)


Schema = Mapping[str, tuple[Callable[[Any], bool], Any]]

_RECORD: Schema = {
    "run_id": (_is_str, ""),
    "owner": (_is_str, _REQUIRED),  # without it, nobody could resume the run
    "route": (_is_str, ""),
    "body": (_is_object, _REQUIRED),  # the request every leg continues
    "created": (_is_number, 0.0),
    "protocol": (_is_str, "chat"),
    "query": (_is_str, ""),
    "fallbacks": (_is_strings, None),
    "trace": (_is_str, None),
    "version": (_is_int, 1),
}
_STATE: Schema = {
    "seq": (_is_int, 0),
    "status": (_is_str, "running"),
    "leg": (_is_int, 0),
    "splice_leg": (_is_int, 0),
    "usage_by_leg": (_by_leg, {}),
    "estimated_by_leg": (_by_leg, {}),
    "output_spent": (_is_int, None),
    "in_flight": (_is_list, []),
    "text_chars": (_is_int, 0),
    "reasoning_chars": (_is_int, 0),
    "tool_calls": (_is_int, 0),
    "cause": (_is_str, None),
    "updated": (_is_number, 0.0),
    "version": (_is_int, 1),
    "acked": (_is_int, None),
    "background": (_is_str, None),
}
_CALL: Schema = {"name": (_is_str, ""), "arguments": (_is_str, "")}


def _read(kind: str, raw: bytes, schema: Schema) -> dict[str, Any]:
    """A stored record or state as this release's fields; refused if of a newer format."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    fields = _fields(kind, data, schema)
    if fields["version"] > FORMAT:
        logger.warning(
            "a run's checkpoint is of a newer format than this release reads",
            extra={"run_id": fields.get("run_id"), "format": fields["version"], "reads": FORMAT},
        )
        raise RunUnreadable(
            f"This run was checkpointed by a later release of the gateway in a format "
            f"(the {kind}'s version {fields['version']}) that this replica, which reads "
            f"formats up to {FORMAT}, cannot continue; a replica of that release can: "
            "resume it again there."
        )
    return fields


def _fields(kind: str, data: Any, schema: Schema) -> dict[str, Any]:
    """``data``'s fields named in ``schema``, checked, the missing ones defaulted."""
    if not isinstance(data, dict):
        raise _unreadable(kind, "it is not a JSON object")
    fields: dict[str, Any] = {}
    for name, (check, default) in schema.items():
        value = data.get(name)
        if value is None:
            if default is _REQUIRED:
                raise _unreadable(kind, f"it has no {name!r}")
            value = default.copy() if isinstance(default, dict | list) else default
        elif not check(value):
            raise _unreadable(kind, f"its {name!r} is {type(value).__name__} {value!r:.60}")
        fields[name] = value
    return fields


def _unreadable(kind: str, why: str) -> RunUnreadable:
    logger.warning("a run's checkpoint cannot be read", extra={"part": kind, "why": why})
    return RunUnreadable(
        f"This run's stored {kind} cannot be read by this replica ({why}): it was written "
        "by a release whose format this one does not know, or damaged. A replica of the "
        "release that wrote it may resume it."
    )


def owner_hash(key: bytes, credential: str | None) -> str:
    """A keyed hash of the credential that started a run: comparable, not reversible."""
    return hmac.new(key, (credential or "").encode(), hashlib.sha256).hexdigest()


def split_events(data: bytes) -> list[bytes]:
    """SSE events as the gateway writes them: ``data: …`` lines, each ending in a blank line."""
    return [part + b"\n\n" for part in data.split(b"\n\n") if part]

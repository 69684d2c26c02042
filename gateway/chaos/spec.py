"""The chaos spec: what a request asks the chaos upstream to do, read from its model name.

Grammar (an ``x-chaos`` request header, when present, replaces the model name)::

    spec  := "chaos" [ ":" pair ( "," pair )* ]
    pair  := key "=" value

For example ``chaos:text=40,tools=2,fault=reset,at=12,times=1,pace_ms=5``. A model
name that does not start with ``chaos`` gets the default spec, so any client can
point at the chaos upstream unchanged; a name that does start with ``chaos`` but
does not parse is an error, because a typo in a fault would otherwise silently
run a clean test.

Two keys play a real model's variance between requests (``answer.py``), each
request numbered by its spec string (``attempt``, as ``times=`` counts): with
``rechunk=1`` every request says the same text split at other boundaries, with
``sample=1`` every request says other text after the prefix it continues.

``fault=goaway`` and ``fault=rst_stream`` are HTTP/2 faults, for an HTTP/2 server
answering with these scripts (the tests' h2 upstream, ``tests/net/h2_upstream.py``):
after ``at`` deltas, a GOAWAY frame that leaves the stream unprocessed, then the
connection closes; or a RST_STREAM (INTERNAL_ERROR) of that stream alone. HTTP/1.1
has neither frame: the chaos upstream plays both as ``reset``.

``fault=error_data`` is Gemini's in-band error as a ``data:`` event, beside ``error``,
Google's raw JSON object after the events (``gemini_stream.py``); the other dialects,
whose in-band errors are events already, play it as their ``error``.

A Responses request with ``background: true`` (``background.py``) outlives its
connection: a connection fault cuts only that connection, an in-band error fails the
stored generation; ``retrieve_faults=K`` cuts the first K streamed retrieves too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

LINE_ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}

# Faults that change the body after it started (or, for non-streaming, cut it).
STREAM_FAULTS = frozenset(
    {
        "reset",
        "close",
        "stall",
        "error",
        "error_done",
        "error_fatal",
        "finish_error",
        "no_finish",
        "malformed",
    }
)
# Faults of one dialect's wire: Gemini's in-band error as a ``data:`` event (its ``error``
# is a raw JSON object after the events). Every other dialect's in-band error already is
# an event: there it is that dialect's ``error``.
GEMINI_FAULTS = {"error_data": "error"}
# Faults answered with an error status instead of the stream.
HTTP_FAULTS = {
    "http_400": 400,
    "http_400_context": 400,
    "http_401": 401,
    "http_404": 404,
    "http_429": 429,
    "http_429_retry": 429,
    "http_500": 500,
    "http_502": 502,
    "http_503": 503,
    "http_529": 529,
}
# HTTP/2 faults (a GOAWAY, a RST_STREAM, mid-stream), and what HTTP/1.1 plays them as.
# Not in STREAM_FAULTS: those are what every chaos endpoint does on its own wire.
HTTP2_FAULTS = {"goaway": "reset", "rst_stream": "reset"}
FAULTS = (
    STREAM_FAULTS
    | GEMINI_FAULTS.keys()
    | HTTP_FAULTS.keys()
    | HTTP2_FAULTS.keys()
    | {"reset_before"}
)


@dataclass(frozen=True)
class ChaosSpec:
    """A parsed spec. ``source`` is the exact string it came from: ``times=`` counts by it."""

    source: str = "chaos"
    text: int = 20
    reasoning: int = 0
    tools: int = 0
    arg_deltas: int = 4
    seed: int = 0
    pace_ms: float = 0.0
    first_byte_ms: float = 0.0
    usage: bool = False
    lineend: str = "lf"
    comments: bool = False
    split: int = 0  # 0: no splitting
    done: bool = True
    fault: str | None = None
    at: int | None = None  # None: half-way through the content deltas
    times: int | None = None  # None: fault every request
    stall_s: float = 300.0
    retry_after: int = 1
    echo: int = 0
    echo_prefix: bool = False
    anchor: bool = True  # repeat the anchor a prompt-mode continuation quotes
    prefill: bool = True  # 0: refuse a trailing assistant message with a 400
    rechunk: bool = False  # 1: the same text, split into deltas anew by every request
    sample: bool = False  # 1: other text after the prefix on every request
    # N: the Responses usage also reports counters no SDK or gateway knows yet (a nested
    # ``input_tokens_details.future_tokens`` and ``future_usage.units``), N each.
    usage_extra: int = 0
    # K: the first K streamed retrieves of each background response (background.py) are
    # cut too, by the spec's connection fault (else a reset), ``at`` deltas after they start.
    retrieve_faults: int = 0

    @property
    def line_ending(self) -> bytes:
        return LINE_ENDINGS[self.lineend]


def _integer(low: int, high: int) -> Callable[[str], int]:
    def convert(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError("not an integer") from None
        if not low <= number <= high:
            raise ValueError(f"must be between {low} and {high}")
        return number

    return convert


def _number(low: float, high: float) -> Callable[[str], float]:
    def convert(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise ValueError("not a number") from None
        if math.isnan(number) or not low <= number <= high:
            raise ValueError(f"must be between {low:g} and {high:g}")
        return number

    return convert


def _flag(value: str) -> bool:
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise ValueError("must be 0 or 1")


def _one_of(choices: frozenset[str] | set[str]) -> Callable[[str], str]:
    def convert(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(sorted(choices))}")
        return value

    return convert


# The bounds keep one request from exhausting the server's memory or a test's patience.
_KEYS: dict[str, Callable[[str], object]] = {
    "text": _integer(0, 100_000),
    "reasoning": _integer(0, 100_000),
    "tools": _integer(0, 1_000),
    "arg_deltas": _integer(1, 10_000),
    "seed": _integer(0, 2**63 - 1),
    "pace_ms": _number(0, 600_000),
    "first_byte_ms": _number(0, 600_000),
    "usage": _flag,
    "lineend": _one_of(set(LINE_ENDINGS)),
    "comments": _flag,
    "split": _integer(1, 1 << 20),
    "done": _flag,
    "fault": _one_of(FAULTS),
    "at": _integer(0, 1_000_000),
    "times": _integer(0, 1_000_000_000),
    "stall_s": _number(0, 86_400),
    "retry_after": _integer(0, 86_400),
    "echo": _integer(0, 1_000_000),
    "echo_prefix": _flag,
    "anchor": _flag,
    "prefill": _flag,
    "rechunk": _flag,
    "sample": _flag,
    "usage_extra": _integer(0, 1_000_000),
    "retrieve_faults": _integer(0, 1_000_000),
}


def parse_spec(model: str) -> ChaosSpec:
    """Parse a model name (or ``x-chaos`` header); raise ``ValueError`` saying what is wrong."""
    if model != "chaos" and not model.startswith("chaos:"):
        if model.startswith("chaos"):
            raise ValueError(
                f"invalid chaos spec {model!r}: expected 'chaos' or 'chaos:key=value,...'"
            )
        return ChaosSpec(source=model)
    values: dict[str, object] = {}
    for pair in model[len("chaos:") :].split(","):
        if not pair.strip():
            continue  # tolerate "chaos:" and trailing commas
        key, sep, value = (part.strip() for part in pair.partition("="))
        if not sep:
            raise ValueError(f"invalid chaos spec {model!r}: {pair!r} is not key=value")
        if key not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            raise ValueError(f"invalid chaos spec {model!r}: unknown key {key!r} (known: {known})")
        if key in values:
            raise ValueError(f"invalid chaos spec {model!r}: {key!r} given twice")
        try:
            values[key] = _KEYS[key](value)
        except ValueError as exc:
            raise ValueError(f"invalid chaos spec {model!r}: {key}={value!r}: {exc}") from None
    return ChaosSpec(source=model, **values)  # type: ignore[arg-type]


class SpecCounts:
    """Requests counted by their exact spec string, as ``times=`` and ``attempt`` count
    them (shared by every server that answers chaos specs)."""

    def __init__(self) -> None:
        self._faulted: dict[str, int] = {}  # spec string -> requests seen carrying it
        self._attempts: dict[str, int] = {}  # spec string -> completions requested with it

    def take_fault(self, spec: ChaosSpec) -> str | None:
        """The fault this request gets: ``times=T`` spares all but the first T carrying it."""
        if spec.fault is None or spec.times is None:
            return spec.fault
        seen = self._faulted.get(spec.source, 0)
        self._faulted[spec.source] = seen + 1
        return spec.fault if seen < spec.times else None

    def take_attempt(self, spec: ChaosSpec) -> int:
        """This request's number among the completions carrying the spec (0: the first)."""
        attempt = self._attempts.get(spec.source, 0)
        self._attempts[spec.source] = attempt + 1
        return attempt

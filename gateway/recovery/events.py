"""Neutral upstream events: what one SSE ``data:`` payload means to the recovery engine.

Each protocol adapter (``gateway.protocols``) decodes its own payloads into these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(slots=True)
class Chunk:
    """A payload that belongs to the answer; ``data`` is as received, for pass-through."""

    data: bytes
    obj: dict[str, Any]


@dataclass(slots=True)
class InBandError:
    """An error sent inside a 200 stream (OpenRouter, vLLM; a Responses ``error`` event)."""

    error: dict[str, Any]

    @property
    def message(self) -> str:
        message = self.error.get("message")
        return message if isinstance(message, str) and message else "upstream error"


@dataclass(slots=True)
class Done:
    """The upstream says its stream is over (``data: [DONE]``)."""


@dataclass(slots=True)
class Malformed:
    """A payload that is not a JSON object; skipped and counted, never fatal."""

    data: bytes


Event = Chunk | InBandError | Done | Malformed

DONE = Done()


def decode(data: bytes) -> Chunk | Malformed:
    """A payload as a JSON object (a ``Chunk`` to classify further), or ``Malformed``.

    Invalid UTF-8 (orjson refuses it) is decoded as a direct client's SDK would
    (httpx2 decodes with replacement): U+FFFD, never a silent drop of the whole event
    and its content. The repaired payload is what is relayed.
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            data = data.decode("utf-8", "replace").encode()
            obj = orjson.loads(data)
        except (UnicodeError, orjson.JSONDecodeError):
            return Malformed(data)
    return Chunk(data, obj) if isinstance(obj, dict) else Malformed(data)

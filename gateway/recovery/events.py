"""Normalized upstream events: what one SSE ``data:`` payload means to the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(slots=True)
class Chunk:
    """A ``chat.completion.chunk``; ``data`` is the payload as received, for pass-through."""

    data: bytes
    obj: dict[str, Any]


@dataclass(slots=True)
class InBandError:
    """``{"error": ...}`` sent inside a 200 stream (OpenRouter, vLLM)."""

    error: dict[str, Any]

    @property
    def message(self) -> str:
        message = self.error.get("message")
        return message if isinstance(message, str) and message else "upstream error"


@dataclass(slots=True)
class Done:
    """``data: [DONE]``."""


@dataclass(slots=True)
class Malformed:
    """A payload that is not a JSON object; skipped and counted, never fatal."""

    data: bytes


Event = Chunk | InBandError | Done | Malformed

DONE = Done()


def parse_event(data: bytes) -> Event:
    if data == b"[DONE]":
        return DONE
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            # Invalid UTF-8 (orjson refuses it) is decoded as a direct client's SDK
            # would (httpx decodes with replacement): U+FFFD, never a silent drop of
            # the whole event and its content. The repaired payload is what is relayed.
            data = data.decode("utf-8", "replace").encode()
            obj = orjson.loads(data)
        except (UnicodeError, orjson.JSONDecodeError):
            return Malformed(data)
    if not isinstance(obj, dict):
        return Malformed(data)
    error = obj.get("error")
    if error is not None:
        return InBandError(error if isinstance(error, dict) else {"message": str(error)})
    choices = obj.get("choices")
    if choices is None:
        return Chunk(data, obj)
    if type(choices) is not list or not all(type(c) is dict for c in choices):
        return Malformed(data)
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        if delta is not None and type(delta) is not dict:
            return Malformed(data)
        if choice.get("finish_reason") == "error":
            # vLLM ends an aborted generation this way, with no detail: a server error.
            return InBandError({"message": "finish_reason 'error'", "code": 500})
    return Chunk(data, obj)

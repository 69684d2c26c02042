"""Reading what a splicer wrote: ``event: <type>`` + ``data: {"type": <type>, …}`` frames."""

from __future__ import annotations

from typing import Any

import orjson


def events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON of each frame of ``raw``, each checked: its ``event:`` names its type."""
    parsed = []
    for event in raw.split(b"\n\n"):
        if event:
            head, _, data = event.partition(b"\ndata: ")
            obj = orjson.loads(data)
            assert head == b"event: " + obj["type"].encode(), event
            parsed.append(obj)
    return parsed

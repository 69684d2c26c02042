"""Writing responses: JSON documents, and event streams as chunked bodies, paced or split.

Back-pressure is ``drain()``; every drain that can block is bounded, so a client
that stops reading cannot hold a connection task forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.chaos.faults import reset
from gateway.chaos.http11 import LAST_CHUNK, SSE_HEAD, chunk, json_response

WRITE_TIMEOUT = 300.0  # a client that reads nothing for this long is gone
_BATCH = 256  # events per write when nothing paces or splits them


async def drain(writer: asyncio.StreamWriter) -> None:
    if not writer.transport.get_write_buffer_size():
        await writer.drain()  # cannot block: no timer on the per-write path
        return
    async with asyncio.timeout(WRITE_TIMEOUT):
        await writer.drain()


async def send_json(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    headers: Sequence[tuple[str, str]] = (),
    close: bool = False,
) -> None:
    writer.write(json_response(status, body, headers, close))
    await drain(writer)


async def send_json_cut(writer: asyncio.StreamWriter, body: bytes, fault: str) -> None:
    """Half a JSON answer, then a RST (``reset``) or nothing more (``close``: FIN follows)."""
    response = json_response(200, body)
    writer.write(response[: len(response) - len(body) // 2])
    await drain(writer)
    if fault == "reset":
        await reset(writer)


async def send_events(
    writer: asyncio.StreamWriter,
    events: list[bytes],
    *,
    pace_s: float,
    split: int,
    end: bool,
    head: bytes = SSE_HEAD,
) -> None:
    """Write the stream's head and events as chunks, ending the body only if ``end``."""
    last = LAST_CHUNK if end else b""
    if not pace_s and not split:
        # The benchmark path: one write per batch of events (a typical answer is one
        # batch); drain() between batches holds a huge answer to the client's pace.
        for start in range(0, max(len(events), 1), _BATCH):
            batch = [chunk(event) for event in events[start : start + _BATCH]]
            if start == 0:
                batch.insert(0, head)
            if start + _BATCH >= len(events):
                batch.append(last)
            writer.write(b"".join(batch))
            await drain(writer)
        return
    writer.write(head)
    await drain(writer)
    # Paced: each event on its own. Unpaced: the pieces of split= straddle events too.
    # Each piece is its own chunk and its own write, so a client reads it on its own.
    units = events if pace_s else [b"".join(events)]
    for index, unit in enumerate(units):
        if index and pace_s:
            await asyncio.sleep(pace_s)
        step = split or len(unit) or 1
        for start in range(0, len(unit), step):
            writer.write(chunk(unit[start : start + step]))
            await drain(writer)
    if last:
        writer.write(last)
        await drain(writer)

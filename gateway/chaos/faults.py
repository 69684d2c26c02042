"""What each fault does to a response: which events it sends, then how the body ends.

``break_stream`` is pure: it decides, from the response's event payloads and the
fault, what goes on the wire and whether the body then ends properly, is reset,
is closed without its last chunk, or stalls. The transport actions follow it.

A fault fires after ``at`` content-bearing deltas (text, reasoning, tool-argument
fragments; not the role delta or a tool call's header), counted from the start of
the response; with no ``at`` it fires half-way through the content. A Responses
stream (``responses.py``) counts the same deltas; its faults are ``break_responses``.
An Anthropic Messages stream (``messages.py``) counts its ``thinking_delta``,
``text_delta`` and non-empty ``input_json_delta`` events; its faults are
``break_messages``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Literal

from gateway.chaos import messages
from gateway.chaos.render import DONE, IN_BAND_ERRORS, MALFORMED
from gateway.chaos.responses import IN_BAND_ERRORS as RESPONSES_ERRORS
from gateway.chaos.responses import MALFORMED_EVENT, Event

Ending = Literal["end", "reset", "close", "stall"]

_BREAKS: dict[str, Ending] = {"reset": "reset", "close": "close", "stall": "stall"}
_FLUSH_TIMEOUT = 2.0
_SIOCOUTQNSD = 0x894B  # Linux: bytes in the send queue not yet sent


def fault_cut(counts: Sequence[bool], at: int | None, opening: int = 1) -> int:
    """The index of the first event sent after the fault point: right after the ``at``-th
    content delta, never before the ``opening`` events (chat's role chunk; a Responses
    stream's ``response.created`` and ``response.in_progress``)."""
    target = sum(counts) // 2 if at is None else at
    seen, cut = 0, opening
    for index, counted in enumerate(counts):
        if counted:
            if seen == target:
                break
            seen += 1
            cut = index + 1
    return cut


def break_stream(
    fault: str | None,
    cut: int,
    payloads: list[bytes],
    trailer: list[bytes],
    done: bool,
    finish_error: bytes,
) -> tuple[list[bytes], Ending]:
    """The data payloads a response sends under ``fault``, and how its body ends.

    ``payloads`` runs from the role chunk to the finish chunk; ``trailer`` is what
    follows the finish chunk before ``[DONE]`` (the usage chunk, when asked for).
    """
    done_event = [DONE] if done else []
    if fault is None:
        return payloads + trailer + done_event, "end"
    sent = payloads[:cut]
    if fault == "malformed":
        return sent + [MALFORMED] + payloads[cut:] + trailer + done_event, "end"
    if fault in ("error", "error_fatal"):
        return sent + [IN_BAND_ERRORS[fault]], "end"
    if fault == "error_done":  # vLLM sends [DONE] even after an error
        return sent + [IN_BAND_ERRORS["error"], DONE], "end"
    if fault == "finish_error":
        return sent + [finish_error] + done_event, "end"
    if fault == "no_finish":
        return sent + done_event, "end"
    if fault in _BREAKS:
        return sent, _BREAKS[fault]
    raise ValueError(f"not a stream fault: {fault!r}")


def break_responses(
    fault: str | None,
    cut: int,
    events: list[Event],
    error_event: Callable[[str], Event],
) -> tuple[list[Event], Ending]:
    """``break_stream`` for a Responses stream (``events`` from ``response.created`` to
    ``response.completed``): the events sent under ``fault``, and how the body ends.

    ``error``/``error_fatal`` end with an ``error`` event, ``error_done``/``finish_error``
    with ``response.failed`` (``error_event(fault)`` makes it); ``no_finish`` ends the
    body cleanly without ``response.completed``. There is no ``[DONE]`` to send.
    """
    if fault is None:
        return events, "end"
    sent = events[:cut]
    if fault == "malformed":
        return sent + [MALFORMED_EVENT] + events[cut:], "end"
    if fault in RESPONSES_ERRORS:
        return sent + [error_event(fault)], "end"
    if fault == "no_finish":
        return sent, "end"
    if fault in _BREAKS:
        return sent, _BREAKS[fault]
    raise ValueError(f"not a stream fault: {fault!r}")


def break_messages(
    fault: str | None, cut: int, events: list[messages.Event]
) -> tuple[list[messages.Event], Ending]:
    """``break_stream`` for an Anthropic Messages stream (``events`` from ``message_start``
    to ``message_stop``): the events sent under ``fault``, and how the body ends.

    ``error``, ``error_fatal``, ``error_done`` and ``finish_error`` end with an ``error``
    event (``messages.IN_BAND_ERRORS``: ``overloaded_error``, ``invalid_request_error``,
    ``api_error``, ``api_error``), ``error_done``'s followed by ``message_stop``;
    ``no_finish`` ends the body cleanly without ``message_delta`` and ``message_stop``;
    ``malformed`` inserts a delta event whose data is not JSON, and the stream goes on.
    """
    if fault is None:
        return events, "end"
    sent = events[:cut]
    if fault == "malformed":
        return sent + [messages.MALFORMED_EVENT] + events[cut:], "end"
    if fault in messages.IN_BAND_ERRORS:
        return sent + messages.fault_events(fault), "end"
    if fault == "no_finish":
        return sent, "end"
    if fault in _BREAKS:
        return sent, _BREAKS[fault]
    raise ValueError(f"not a stream fault: {fault!r}")


def _unsent(sock: socket.socket | None) -> int:
    if sys.platform != "linux" or sock is None:
        return 0
    import fcntl

    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQNSD, b"\0" * 4))[0])
    except OSError:
        return 0


async def _flushed(writer: asyncio.StreamWriter) -> None:
    """Wait (bounded) until what was written has left the host.

    ``drain()`` only bounds the buffer; a RST discards whatever the kernel has not
    sent yet, so without this the client could see fewer deltas than ``at=`` says.
    """
    sock = writer.get_extra_info("socket")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _FLUSH_TIMEOUT
    while writer.transport.get_write_buffer_size() or _unsent(sock):
        if loop.time() > deadline:
            return  # the client is not reading; reset anyway
        await asyncio.sleep(0.002)


async def reset(writer: asyncio.StreamWriter, flush: bool = True) -> None:
    """Abort the connection with a TCP RST: the client's next read fails with ECONNRESET.

    SO_LINGER on with a zero timeout makes close() drop the connection instead of
    sending a FIN after the queued data.
    """
    if flush:
        await _flushed(writer)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def stall(reader: asyncio.StreamReader, seconds: float) -> None:
    """Send nothing more; return when the client goes away, or after ``seconds``."""
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass  # a client may send more; a stalled server does not answer it

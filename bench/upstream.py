"""The benchmark upstream: an OpenAI-compatible server that costs as little as possible.

    .venv/bin/python -m bench.upstream --port 8001 [--reuse-port]

Every response is rendered once and then written from a cache, so the upstream
is never what a benchmark measures. The model name is the workload::

    bench-64x20ms    64 content deltas, one every 20 ms (the first at once)

(no comma: LiteLLM's proxy reads a comma in a model name as a list of models).

A streaming request gets a role chunk, the content chunks, a finish chunk, a
usage chunk if ``stream_options.include_usage`` is set, and ``[DONE]``, chunked
over HTTP/1.1 keep-alive; a non-streaming one gets the whole ``chat.completion``.
``POST /v1/responses`` answers the same text in the Responses API's events, with
the same pacing: ``response.created``, ``response.in_progress``, the message's
``output_item.added`` and ``content_part.added`` at once, one
``output_text.delta`` per content chunk, then ``output_text.done``,
``content_part.done``, ``output_item.done`` and ``response.completed`` with
usage (each ``event: <type>`` + ``data: {"type":..., "sequence_number": n, ...}``);
a non-streaming one gets the completed Response object.
Pacing is one ``call_at`` per chunk on the event loop (absolute times: a late
chunk does not delay the ones after it). With ``--reuse-port`` several processes
can share one port (``SO_REUSEPORT``). ``GET /v1/models`` answers readiness.

The fault-injecting ``chaos-upstream`` is the server for recovery benchmarks;
this one does no faults, records nothing and parses only what it must.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import socket
from typing import Any, cast

import orjson
import uvloop

_MODEL = re.compile(r"bench-(\d+)x(\d+)ms")
_MAX_REQUEST = 1 << 20
_WORDS = ("The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".")


def _head(status: int, content_type: str, length: int | None) -> bytes:
    framing = "transfer-encoding: chunked" if length is None else f"content-length: {length}"
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n{framing}\r\n\r\n".encode()
    )


def _framed(event: bytes) -> bytes:
    """One SSE event as one HTTP chunk."""
    data = b"data: " + event + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(data), data)


def _json(status: int, body: Any) -> bytes:
    payload = orjson.dumps(body)
    return _head(status, "application/json", len(payload)) + payload


def _error(status: int, message: str) -> bytes:
    return _json(status, {"error": {"message": message, "type": "invalid_request_error"}})


@functools.cache
def _stream(model: str, chunks: int, usage: bool) -> tuple[bytes, tuple[bytes, ...], bytes]:
    """(head + role chunk, content chunks, tail) of one streamed answer, HTTP-framed."""
    meta = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    meta += b'"model":' + orjson.dumps(model) + b',"choices":[{"index":0,"delta":'
    end = b',"logprobs":null,"finish_reason":null}]}'
    role = _framed(meta + b'{"role":"assistant","content":""}' + end)
    content = tuple(
        _framed(meta + orjson.dumps({"content": _WORDS[i % len(_WORDS)]}) + end)
        for i in range(chunks)
    )
    tail = _framed(meta + b'{},"logprobs":null,"finish_reason":"stop"}]}')
    if usage:
        counts = {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks}
        tail += _framed(
            meta[: meta.index(b'"choices"')]
            + b'"choices":[],"usage":'
            + (orjson.dumps(counts) + b"}")
        )
    tail += _framed(b"[DONE]") + b"0\r\n\r\n"
    return _head(200, "text/event-stream", None) + role, content, tail


@functools.cache
def _completion(model: str, chunks: int) -> bytes:
    text = "".join(_WORDS[i % len(_WORDS)] for i in range(chunks))
    return _json(
        200,
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": chunks, "total_tokens": 8 + chunks},
        },
    )


def _response(model: str, chunks: int, status: str) -> dict[str, Any]:
    """A Response object (the completed one carries the message and usage)."""
    done = status == "completed"
    return {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1700000000,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "output": [_message(chunks, "completed")] if done else [],
        "parallel_tool_calls": True,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "usage": (
            {
                "input_tokens": 8,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": chunks,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 8 + chunks,
            }
            if done
            else None
        ),
    }


def _message(chunks: int | None, status: str) -> dict[str, Any]:
    """The message output item; ``chunks`` None: as added, with no content yet."""
    item: dict[str, Any] = {"id": "msg_bench", "type": "message", "role": "assistant"}
    if chunks is None:
        return item | {"status": status, "content": []}
    return item | {"status": status, "content": [_part(chunks)]}


def _part(chunks: int) -> dict[str, Any]:
    text = "".join(_WORDS[i % len(_WORDS)] for i in range(chunks))
    return {"type": "output_text", "text": text, "annotations": []}


def _event(kind: str, number: int, fields: dict[str, Any]) -> bytes:
    """One Responses event (``event:`` line, then its data) as one HTTP chunk."""
    head = b'{"type":"%s","sequence_number":%d' % (kind.encode(), number)
    data = b"event: " + kind.encode() + b"\ndata: " + head
    data += (b"," + orjson.dumps(fields)[1:] if fields else b"}") + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(data), data)


@functools.cache
def _responses_stream(model: str, chunks: int) -> tuple[bytes, tuple[bytes, ...], bytes]:
    """(head + opening events, text delta events, closing events) of one Responses stream."""
    where = {"item_id": "msg_bench", "output_index": 0, "content_index": 0}
    opening: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": _response(model, chunks, "in_progress")}),
        ("response.in_progress", {"response": _response(model, chunks, "in_progress")}),
        ("response.output_item.added", {"output_index": 0, "item": _message(None, "in_progress")}),
        (
            "response.content_part.added",
            where | {"part": {"type": "output_text", "text": "", "annotations": []}},
        ),
    ]
    head = b"".join(_event(kind, n, fields) for n, (kind, fields) in enumerate(opening))
    first = len(opening)
    content = tuple(
        _event(
            "response.output_text.delta",
            first + i,
            where | {"delta": _WORDS[i % len(_WORDS)], "logprobs": []},
        )
        for i in range(chunks)
    )
    part = _part(chunks)
    closing: list[tuple[str, dict[str, Any]]] = [
        ("response.output_text.done", where | {"text": part["text"], "logprobs": []}),
        ("response.content_part.done", where | {"part": part}),
        ("response.output_item.done", {"output_index": 0, "item": _message(chunks, "completed")}),
        ("response.completed", {"response": _response(model, chunks, "completed")}),
    ]
    after = first + chunks
    tail = b"".join(_event(kind, after + n, fields) for n, (kind, fields) in enumerate(closing))
    return _head(200, "text/event-stream", None) + head, content, tail + b"0\r\n\r\n"


@functools.cache
def _responses_document(model: str, chunks: int) -> bytes:
    return _json(200, _response(model, chunks, "completed"))


MODELS = _json(200, {"object": "list", "data": [{"id": "bench", "object": "model"}]})


class Connection(asyncio.Protocol):
    """One client connection: requests in order, one response at a time."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._busy = False  # a paced response is still being written
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > _MAX_REQUEST:
            self._close(_error(400, "request too large"))
            return
        self._next()

    def _close(self, response: bytes) -> None:
        if self._transport is not None:
            self._transport.write(response)
            self._transport.close()

    def _next(self) -> None:
        """Answer the next complete request in the buffer, unless a response is going."""
        if self._busy or self._transport is None:
            return
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self._buffer[:end]).lower()
        length = 0
        at = head.find(b"\r\ncontent-length:")
        if at >= 0:
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else None])
        if len(self._buffer) < end + 4 + length:
            return
        body = bytes(self._buffer[end + 4 : end + 4 + length])
        del self._buffer[: end + 4 + length]
        self._answer(head.split(b" ", 2), body)

    def _answer(self, request_line: list[bytes], body: bytes) -> None:
        assert self._transport is not None
        method, path = request_line[0], request_line[1].split(b"?")[0]
        if method == b"get" and path.rstrip(b"/").endswith(b"/models"):
            self._transport.write(MODELS)
            return self._next()
        responses = path.endswith(b"/responses")
        if method != b"post" or not (responses or path.endswith(b"/chat/completions")):
            self._transport.write(_error(404, "not found"))
            return self._next()
        try:
            request = orjson.loads(body)
            model = request["model"]
            chunks, pace_ms = map(int, _MODEL.fullmatch(model).groups())  # type: ignore[union-attr]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            self._transport.write(_error(400, "model must be bench-<chunks>x<pace>ms"))
            return self._next()
        if not request.get("stream"):
            document = _responses_document if responses else _completion
            self._transport.write(document(model, chunks))
            return self._next()
        if responses:
            head, content, tail = _responses_stream(model, chunks)
        else:
            options = request.get("stream_options") or {}
            head, content, tail = _stream(model, chunks, bool(options.get("include_usage")))
        self._transport.write(head)
        self._busy = True
        loop = asyncio.get_running_loop()
        self._send(loop, content, tail, 0, loop.time(), pace_ms / 1000)

    def _send(
        self,
        loop: asyncio.AbstractEventLoop,
        content: tuple[bytes, ...],
        tail: bytes,
        index: int,
        start: float,
        pace: float,
    ) -> None:
        self._timer = None
        if self._transport is None:  # the client went away
            return
        if index < len(content):
            self._transport.write(content[index])
            when = start + (index + 1) * pace
            self._timer = loop.call_at(
                when, self._send, loop, content, tail, index + 1, start, pace
            )
            return
        self._transport.write(tail)
        self._busy = False
        self._next()


async def serve(port: int, reuse_port: bool) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        Connection, "127.0.0.1", port, reuse_port=reuse_port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--reuse-port", action="store_true", help="share the port with other processes"
    )
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.reuse_port))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        raise SystemExit(130) from None

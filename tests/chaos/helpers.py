"""Client-side helpers: read a chaos stream as bytes, decode its SSE, add up its deltas."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx2

from gateway.chaos.answer import script_for
from gateway.chaos.spec import parse_spec

USER = {"role": "user", "content": "Say something."}


def first_deltas(spec: str, count: int) -> str:
    """The text of the first ``count`` text deltas of ``spec``'s answer."""
    return "".join(script_for(parse_spec(spec)).text_deltas[:count])


def decode_sse(raw: bytes) -> list[str]:
    """The data of each complete event, decoded as the SSE spec says (any line ending)."""
    lines = re.split(r"\r\n|\r|\n", raw.decode("utf-8"))[:-1]  # the last one is unterminated
    events: list[str] = []
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                events.append("\n".join(data))
            data = []
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))
    return events


@dataclass
class Collected:
    """The deltas of a chat stream, added up."""

    text: str = ""
    reasoning: str = ""
    content_deltas: int = 0
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reasons: list[str] = field(default_factory=list)
    usage: dict[str, int] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)


def collect(data: list[str]) -> Collected:
    collected = Collected()
    for item in data:
        if item == "[DONE]":
            continue
        chunk = json.loads(item)
        if "error" in chunk:
            collected.errors.append(chunk["error"])
            continue
        if chunk.get("usage"):
            collected.usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice.get("delta", {})
            if "role" in delta:
                collected.roles.append(delta["role"])
            if delta.get("content"):
                collected.text += delta["content"]
                collected.content_deltas += 1
            if delta.get("reasoning_content"):
                collected.reasoning += delta["reasoning_content"]
                collected.content_deltas += 1
            for call in delta.get("tool_calls", []):
                entry = collected.tool_calls.setdefault(
                    call["index"], {"id": "", "name": "", "arguments": ""}
                )
                entry["id"] += call.get("id", "")
                function = call.get("function", {})
                entry["name"] += function.get("name", "")
                if function.get("arguments"):
                    entry["arguments"] += function["arguments"]
                    collected.content_deltas += 1
            if choice.get("finish_reason"):
                collected.finish_reasons.append(choice["finish_reason"])
    return collected


@dataclass
class Received:
    status: int
    headers: httpx2.Headers
    chunks: list[bytes]
    error: httpx2.TransportError | None

    @property
    def raw(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def data(self) -> list[str]:
        return decode_sse(self.raw)

    def collect(self) -> Collected:
        return collect(self.data)


def stream(
    client: httpx2.Client,
    model: str,
    messages: list[dict[str, Any]] | None = None,
    *,
    path: str = "/chat/completions",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Received:
    """POST a streaming request; keep every raw chunk, and the transport error that ended it."""
    body: dict[str, Any] = {"model": model, "stream": True, **extra}
    if path == "/chat/completions":
        body["messages"] = [USER] if messages is None else messages
    else:
        body.setdefault("prompt", "Say something.")
    chunks: list[bytes] = []
    error: httpx2.TransportError | None = None
    with client.stream("POST", path, json=body, headers=headers) as response:
        try:
            for piece in response.iter_raw():
                chunks.append(piece)
        except httpx2.TransportError as exc:
            error = exc
    return Received(response.status_code, response.headers, chunks, error)


@dataclass
class Raw:
    """A stream of named events as bytes (the Responses and Messages dialects): its
    status, the pieces read, and the transport error that ended it, if one did."""

    status: int
    chunks: list[bytes]
    error: httpx2.TransportError | None

    @property
    def raw(self) -> bytes:
        return b"".join(self.chunks)

    def events(self) -> list[tuple[str, str]]:
        """``(event field, data)`` of each complete event, decoded as SSE says (any line end)."""
        lines = re.split(r"\r\n|\r|\n", self.raw.decode("utf-8"))[:-1]
        events: list[tuple[str, str]] = []
        name, data = "", list[str]()
        for line in lines:
            if not line:
                if data:
                    events.append((name, "\n".join(data)))
                name, data = "", []
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
        return events

    def objects(self) -> list[dict[str, Any]]:
        """The JSON events, checked against their ``event:`` field (malformed ones dropped)."""
        objects = []
        for name, data in self.events():
            try:
                obj = json.loads(data)
            except json.JSONDecodeError:
                continue
            assert obj["type"] == name
            objects.append(obj)
        return objects


def read_raw(client: httpx2.Client, path: str, payload: dict[str, Any]) -> Raw:
    """POST ``payload`` to ``path`` and read the answer's bytes until it ends or breaks."""
    chunks: list[bytes] = []
    error: httpx2.TransportError | None = None
    with client.stream("POST", path, json=payload) as response:
        try:
            for piece in response.iter_raw():
                chunks.append(piece)
        except httpx2.TransportError as exc:
            error = exc
    return Raw(response.status_code, chunks, error)


def json_document(response: httpx2.Response) -> Any:
    """The body of a non-streaming answer, checked to be a 200 in JSON."""
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    return response.json()

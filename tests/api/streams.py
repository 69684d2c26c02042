"""Assembling what an openai SDK client received from a stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx2
from openai import OpenAI, Stream
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from gateway.chaos import expected_answer

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]


@dataclass
class Received:
    text: str = ""
    reasoning: str = ""
    roles: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)
    usage: list[Any] = field(default_factory=list)
    chunks: int = 0

    def feed(self, chunk: ChatCompletionChunk) -> None:
        self.chunks += 1
        self.ids.add(chunk.id)
        if chunk.usage is not None:
            self.usage.append(chunk.usage)
        for choice in chunk.choices:
            delta = choice.delta
            if delta.role:
                self.roles.append(delta.role)
            self.text += delta.content or ""
            extra = delta.model_extra or {}
            self.reasoning += extra.get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                slot = self.tool_calls.setdefault(call.index, {"id": None, "name": "", "args": ""})
                if call.id:
                    slot["id"] = call.id
                if call.function and call.function.name:
                    slot["name"] += call.function.name
                if call.function and call.function.arguments:
                    slot["args"] += call.function.arguments
            if choice.finish_reason:
                self.finish_reasons.append(choice.finish_reason)

    def calls(self) -> list[tuple[str | None, str, str]]:
        return [(c["id"], c["name"], c["args"]) for _, c in sorted(self.tool_calls.items())]


def receive(stream: Stream[ChatCompletionChunk], into: Received | None = None) -> Received:
    """Drain ``stream`` into ``into`` (so a caller can inspect a partial result on error)."""
    received = Received() if into is None else into
    for chunk in stream:
        received.feed(chunk)
    return received


def stream_chat(client: OpenAI, model: str, **kwargs: Any) -> Received:
    """Stream a chat completion for ``model`` and assemble what the client received."""
    chunks: Stream[ChatCompletionChunk] = client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, **kwargs
    )
    return receive(chunks)


# -- one run across connections (durable runs) ------------------------------------------


def start(
    client: OpenAI, model: str, into: Received, chunks: int
) -> tuple[str, Stream[ChatCompletionChunk]]:
    """Start a stream and read ``chunks`` chunks into ``into``; the run id and the open stream."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, stream=True
    )
    stream = raw.parse()
    for chunk in stream:
        into.feed(chunk)
        if into.chunks == chunks:
            return raw.headers["x-run-id"], stream
    stream.close()
    raise AssertionError("the run ended before the client disconnected")


def resume(client: OpenAI, model: str, run_id: str, into: Received) -> Received:
    """The SDK way: the same call again, saying which run and how many chunks it has."""
    headers = {"x-run-id": run_id, "x-resume-from": str(into.chunks)}
    with client.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, extra_headers=headers
    ) as stream:
        return receive(stream, into)


def calls_of(model: str, count: int | None = None) -> list[tuple[str, str, str]]:
    """The first ``count`` (or all) tool calls of ``model``'s answer: (id, name, arguments)."""
    calls = [(c.id, c.name, c.arguments) for c in expected_answer(model).tool_calls]
    return calls[:count] if count is not None else calls


def first_raw_events(
    http: httpx2.Client, url: str, body: dict[str, Any], headers: dict[str, str], count: int
) -> tuple[str, bytes, int]:
    """POST a stream and hang up once ``count`` whole events have come: the run id, the
    whole events' bytes, and how many there are (the rest of the last one is lost)."""
    with http.stream("POST", url, json=body, headers=headers) as response:
        run_id = response.headers["x-run-id"]
        raw = b""
        for part in response.iter_raw():
            raw += part
            if raw.count(b"\n\n") >= count:
                break
    received = raw.split(b"\n\n")[:-1]
    return run_id, b"".join(event + b"\n\n" for event in received), len(received)


def assert_whole_text_answer(received: Received, model: str) -> None:
    answer = expected_answer(model)
    assert received.text == answer.text  # nothing lost, nothing repeated
    assert received.roles == ["assistant"]
    assert received.finish_reasons == [answer.finish_reason]
    assert len(received.ids) == 1  # one completion identity across every connection

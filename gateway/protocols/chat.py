"""The chat-completions adapter: ``POST /v1/chat/completions`` (ARCHITECTURE.md section 2)."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError, sse_error_event
from gateway.protocols.base import Adapter
from gateway.protocols.chat_splice import IDENTITY_FIELDS, Splicer
from gateway.recovery.accumulator import REASONING_FIELDS, RunAccumulator, ToolCall
from gateway.recovery.events import DONE, Chunk, Event, InBandError, Malformed, decode

DONE_EVENT = b"data: [DONE]\n\n"
_ERROR = b'data: {"error"'


def parse_event(data: bytes) -> Event:
    if data == b"[DONE]":
        return DONE
    event = decode(data)
    if type(event) is Malformed:
        return event
    assert type(event) is Chunk
    obj = event.obj
    error = obj.get("error")
    if error is not None:
        return InBandError(error if isinstance(error, dict) else {"message": str(error)})
    choices = obj.get("choices")
    if choices is None:
        return event
    if type(choices) is not list or not all(type(c) is dict for c in choices):
        return Malformed(event.data)
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        if delta is not None and type(delta) is not dict:
            return Malformed(event.data)
        if choice.get("finish_reason") == "error":
            # vLLM ends an aborted generation this way, with no detail: a server error.
            return InBandError({"message": "finish_reason 'error'", "code": 500})
    return event


def delta_chars(chunk: dict[str, Any]) -> int:
    """Characters a chunk adds to the answer: content, reasoning, tool-call arguments.

    Arguments count too, or a long tool call would look like a stall.
    """
    choices = chunk.get("choices")
    if not choices:
        return 0
    delta = choices[0].get("delta")
    if not delta:
        return 0
    chars = 0
    for key in ("content", "reasoning_content", "reasoning"):
        text = delta.get(key)
        if type(text) is str:
            chars += len(text)
    calls = delta.get("tool_calls")
    if type(calls) is list:
        for call in calls:
            function = call.get("function") if type(call) is dict else None
            arguments = function.get("arguments") if type(function) is dict else None
            if type(arguments) is str:
                chars += len(arguments)
    return chars


def to_completion(sent: RunAccumulator) -> dict[str, Any]:
    """The assembled non-streaming ``chat.completion``."""
    identity = sent.identity or {}
    message: dict[str, Any] = {"role": sent.role or "assistant", "content": sent.text or None}
    if sent.reasoning_chars:
        message[sent.reasoning_field] = sent.reasoning
    if sent.refusal:
        message["refusal"] = sent.refusal
    if sent.tool_calls:
        message["tool_calls"] = [call.as_message_call() for call in sent.tool_calls]
    completion: dict[str, Any] = {
        "id": identity.get("id"),
        "object": "chat.completion",
        "created": identity.get("created"),
        "model": identity.get("model"),
        "system_fingerprint": identity.get("system_fingerprint"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": sent.finish_reason,
                "logprobs": sent.logprobs or None,
            }
        ],
    }
    usage = sent.usage
    if usage is not None:
        completion["usage"] = usage
    return completion


def replay(events: list[bytes]) -> RunAccumulator:
    """Rebuild what the client assembled from the events it was sent."""
    accumulator = RunAccumulator()
    for event in events:
        payload = event.removeprefix(b"data: ").rstrip(b"\n")
        if payload == b"[DONE]":
            continue
        chunk = orjson.loads(payload)
        if not isinstance(chunk, dict) or "error" in chunk:
            continue
        if accumulator.identity is None:
            accumulator.identity = {k: chunk.get(k) for k in IDENTITY_FIELDS}
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("role") and accumulator.role is None:
                accumulator.role = delta["role"]
            for name in REASONING_FIELDS:
                if delta.get(name):
                    accumulator.add_reasoning(name, delta[name])
            if delta.get("content"):
                accumulator.add_text(delta["content"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                accumulator.tool_calls.append(
                    ToolCall(
                        len(accumulator.tool_calls),
                        call.get("id") or f"call_{len(accumulator.tool_calls)}",
                        function.get("name") or "",
                        function.get("arguments") or "",
                        call.get("type") or "function",
                    )
                )
            if choice.get("finish_reason"):
                accumulator.finish_reason = choice["finish_reason"]
    return accumulator


class ChatSplicer(Splicer):
    def fail(self, error: GatewayError) -> bytes:
        return self.usage_chunk() + sse_error_event(error)


class ChatAdapter(Adapter):
    name = "chat"
    path = "/chat/completions"
    budget_fields = ("max_completion_tokens", "max_tokens")
    format_field = ("response_format",)

    def parse_event(self, data: bytes) -> Event:
        return parse_event(data)

    def delta_chars(self, chunk: Chunk) -> int:
        return delta_chars(chunk.obj)

    def answers(self, chunk: Chunk) -> bool:
        choices = chunk.obj.get("choices")  # parse_event checked its shape
        delta = choices[0].get("delta") if choices else None
        return bool(
            delta and (delta.get("content") or delta.get("tool_calls") or delta.get("refusal"))
        )

    def new_accumulator(self) -> RunAccumulator:
        return RunAccumulator()

    def splicer(self, accumulator: RunAccumulator, body: dict[str, Any]) -> ChatSplicer:
        stream = bool(body.get("stream"))
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return ChatSplicer(
            accumulator, include_usage=include_usage or not stream, assemble=not stream
        )

    def upstream_body(self, body: dict[str, Any], model: str) -> dict[str, Any]:
        body = body | {"model": model}
        if not body.get("stream"):
            # Non-streaming clients get the same protection: the gateway streams from
            # the upstream and assembles the completion itself.
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def assemble(self, accumulator: RunAccumulator) -> dict[str, Any]:
        return to_completion(accumulator)

    def replay(self, events: list[bytes]) -> RunAccumulator:
        return replay(events)

    def is_terminal(self, event: bytes) -> bool:
        return event == DONE_EVENT or event.startswith(_ERROR)

    def succeeded(self, event: bytes) -> bool:
        return event == DONE_EVENT

    def error_event(self, error: GatewayError, events: int) -> bytes:
        return sse_error_event(error)


CHAT = ChatAdapter()

"""What one run has delivered so far: the input to checkpoints and recovery plans.

The accumulator is fed every upstream chunk that reaches the client. It keeps
growing strings as lists of parts (joined only when a snapshot is taken) so the
per-chunk cost stays constant however long the answer gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REASONING_FIELDS = ("reasoning_content", "reasoning")


@dataclass(slots=True)
class ToolCallState:
    index: int
    id: str | None = None
    type: str = "function"
    name_parts: list[str] = field(default_factory=list)
    argument_parts: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "".join(self.name_parts)

    @property
    def arguments(self) -> str:
        return "".join(self.argument_parts)

    def as_message_call(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }


class RunAccumulator:
    """Everything the client was sent for choice 0, plus the stream's identity."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.created: int | None = None
        self.model: str | None = None
        self.system_fingerprint: str | None = None
        self.role: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.reasoning_field = REASONING_FIELDS[0]
        self.tool_calls: dict[int, ToolCallState] = {}
        self.chunks = 0
        self.content_deltas = 0
        self.text_chars = 0
        self._text: list[str] = []
        self._reasoning: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def feed(self, chunk: dict[str, Any]) -> None:
        self.chunks += 1
        if self.id is None:
            self.id = chunk.get("id")
            self.created = chunk.get("created")
            self.model = chunk.get("model")
            self.system_fingerprint = chunk.get("system_fingerprint")
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) == 0:
                self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if delta:
            if self.role is None and delta.get("role"):
                self.role = delta["role"]
            content = delta.get("content")
            if content:
                self._text.append(content)
                self.text_chars += len(content)
                self.content_deltas += 1
            for name in REASONING_FIELDS:
                reasoning = delta.get(name)
                if reasoning:
                    self.reasoning_field = name
                    self._reasoning.append(reasoning)
                    self.content_deltas += 1
            for call in delta.get("tool_calls") or ():
                self._feed_tool_call(call)
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self.finish_reason = finish_reason

    def _feed_tool_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.tool_calls))
        state = self.tool_calls.get(index)
        if state is None:
            state = self.tool_calls[index] = ToolCallState(index)
        if call.get("id"):
            state.id = call["id"]
        if call.get("type"):
            state.type = call["type"]
        function = call.get("function") or {}
        if function.get("name"):
            state.name_parts.append(function["name"])
        if function.get("arguments"):
            state.argument_parts.append(function["arguments"])
            self.content_deltas += 1

    def to_completion(self) -> dict[str, Any]:
        """The assembled non-streaming ``chat.completion`` for what was received."""
        message: dict[str, Any] = {"role": self.role or "assistant", "content": self.text or None}
        if self._reasoning:
            message[self.reasoning_field] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                self.tool_calls[i].as_message_call() for i in sorted(self.tool_calls)
            ]
        completion: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": self.finish_reason,
                    "logprobs": None,
                }
            ],
        }
        if self.usage is not None:
            completion["usage"] = self.usage
        return completion

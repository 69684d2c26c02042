"""The client stream: one answer spliced from one or more upstream legs (contract, section 2).

Pure: upstream chunks in, client SSE bytes out, and a record of what was sent in
the run's accumulator. The splicer guarantees, whatever the legs do:

- one identity (id, created, model, system_fingerprint): the first leg's that sent anything;
- one role delta; reasoning never forwarded a second time by a later leg;
- tool calls released whole, once their JSON arguments are complete, with client
  indices 0, 1, 2… and unique ids;
- text never repeated: after a seam, what the continuation was known to repeat
  first (its anchor, or the whole prefix) is cut exactly (``SeamTrimmer``);
- exactly one finish_reason, and one usage chunk summed over legs on every end
  (``close()``, ``usage_chunk()``).

Fast path: on the first leg, a chunk that needs no change is forwarded as the
bytes received. Anything else is rebuilt once and encoded with orjson.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.recovery.accumulator import (
    REASONING_FIELDS,
    USAGE_COUNTS,
    RunAccumulator,
    ToolCall,
)
from gateway.recovery.events import Chunk
from gateway.recovery.jsonscan import JsonCompleteness
from gateway.recovery.legs import Legs

IDENTITY_FIELDS = ("id", "created", "model", "system_fingerprint")


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


@dataclass(slots=True)
class HeldCall:
    """A tool call of the current leg whose arguments are not complete yet."""

    id: str | None = None
    type: str = "function"
    name_parts: list[str] = field(default_factory=list)
    arguments: JsonCompleteness = field(default_factory=JsonCompleteness)

    @property
    def name(self) -> str:
        return "".join(self.name_parts)


class Splicer(Legs):
    def __init__(
        self, accumulator: RunAccumulator, *, include_usage: bool, assemble: bool = False
    ) -> None:
        super().__init__(accumulator)
        self.include_usage = include_usage
        self.assemble = assemble  # a completion is assembled: keep what only it needs
        self._held: dict[int, HeldCall] = {}
        self._ids: set[str] = set()

    def restore(self, leg: int, in_flight: list[str]) -> None:
        super().restore(leg, in_flight)
        self._ids = {call.id for call in self.sent.tool_calls}

    # -- what recovery needs to know ------------------------------------------------

    def in_flight(self) -> list[str]:
        """Names of tool calls begun on this leg and not released (the client has none)."""
        return self._dropped + [call.name or "unnamed tool" for call in self._held.values()]

    def held_calls(self) -> list[tuple[str, str]]:
        """(name, arguments so far) of the calls in flight: for checkpoints."""
        return [(call.name, call.arguments.text) for call in self._held.values()]

    def holding(self) -> bool:
        return bool(self._held)

    def forget_leg(self) -> None:
        self._held.clear()  # never sent: the new leg may emit those calls again, whole

    # -- chunks ---------------------------------------------------------------------

    def feed(self, chunk: Chunk) -> bytes | None:
        """The client bytes for one upstream chunk, or None when nothing is due yet."""
        obj = chunk.obj
        sent = self.sent
        if sent.identity is None:
            sent.identity = {k: obj.get(k) for k in IDENTITY_FIELDS}
        usage = obj.get("usage")
        if usage:
            sent.set_usage(self.leg, usage)
        choices = obj.get("choices")
        if not choices or self.finished:
            return None  # usage-only chunks are summed and sent once, by close()
        choice = choices[0]
        delta = choice.get("delta") or {}
        finish_reason = choice.get("finish_reason")
        out: dict[str, Any] = {}

        role = delta.get("role")
        if role and sent.role is None:
            sent.role = out["role"] = role
        for name in REASONING_FIELDS:
            reasoning = delta.get(name)
            # A later leg reasons anew; the client already has the first leg's reasoning.
            if reasoning and (self.leg == 0 or not sent.reasoning):
                out[name] = reasoning
                sent.add_reasoning(name, reasoning)
        content = delta.get("content")
        if content:
            if self.seam is not None:
                content = self.seam.feed(content)
            if content:
                out["content"] = content
                sent.add_text(content)
        refusal = delta.get("refusal")
        if refusal:
            out["refusal"] = refusal
            sent.add_refusal(refusal)
        logprobs = choice.get("logprobs")
        if logprobs and out and self.assemble:  # a stream relays them, and that is all
            sent.add_logprobs(logprobs)
        calls = delta.get("tool_calls")
        if calls:
            released = self._hold(calls)
            if released:
                out["tool_calls"] = released
        if finish_reason:
            self._finish(out, finish_reason)

        if self.leg == 0 and out == delta and not usage and b"\n" not in chunk.data:
            # Nothing to change: the payload as received (a payload that came in several
            # data: lines holds newlines and must be re-encoded to stay one event).
            return sse(chunk.data)
        if not out and not finish_reason:
            return None
        return sse(orjson.dumps(self._chunk(out, finish_reason, logprobs if out else None)))

    def _hold(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        released = []
        for call in calls:
            index = call.get("index", 0)
            held = self._held.get(index)
            if held is None:
                held = self._held[index] = HeldCall()
            if call.get("id"):
                held.id = call["id"]
            if call.get("type"):
                held.type = call["type"]
            function = call.get("function") or {}
            if function.get("name"):
                held.name_parts.append(function["name"])
            if held.arguments.feed(function.get("arguments") or ""):
                released.append(self._release(index))
        return released

    def _release(self, index: int) -> dict[str, Any]:
        held = self._held.pop(index)
        call_id = held.id or f"call_{len(self.sent.tool_calls)}"
        if call_id in self._ids:  # a later leg reused an id the client already has
            call_id = f"{call_id}_{len(self.sent.tool_calls)}"
        self._ids.add(call_id)
        call = ToolCall(
            len(self.sent.tool_calls), call_id, held.name, held.arguments.text, held.type
        )
        self.sent.tool_calls.append(call)
        return call.as_delta()

    def _finish(self, out: dict[str, Any], finish_reason: str) -> None:
        if self.seam is not None:
            rest = self.seam.flush()
            if rest:
                out["content"] = out.get("content", "") + rest
                self.sent.add_text(rest)
        # The upstream says the answer is complete: release what it left, as it left it.
        leftover = [self._release(index) for index in sorted(self._held)]
        if leftover:
            out["tool_calls"] = out.get("tool_calls", []) + leftover
        self.sent.finish_reason = finish_reason
        self.finished = True

    def synthesize_tool_use(self) -> bytes:
        """End the answer with the tool calls the client has (plan SynthesizeToolUse)."""
        self._held.clear()
        self.sent.finish_reason = "tool_calls"
        self.finished = True
        return sse(orjson.dumps(self._chunk({}, "tool_calls")))

    def end_at_budget(self) -> bytes:
        """End the answer where its output budget ran out (plan FinishAtBudget): as the
        unbroken answer would have, with ``length``."""
        self._held.clear()
        self.sent.finish_reason = "length"
        self.finished = True
        return sse(orjson.dumps(self._chunk({}, "length")))

    def close(self) -> bytes:
        """The end of a successful answer: the usage chunk if asked, then ``[DONE]``."""
        return self.usage_chunk() + b"data: [DONE]\n\n"

    def usage_chunk(self) -> bytes:
        """The one usage chunk, if the client asked for it (on success and on failure).

        It sums every leg: what each reported, or for a leg that broke before its usage
        chunk, an estimate (``gateway.recovery.usage``).
        """
        if not self.include_usage or self.sent.identity is None:
            return b""  # nothing was ever sent: there is no stream to end with usage
        chunk = self._envelope()
        chunk["choices"] = []
        chunk["usage"] = self.sent.usage or dict.fromkeys(USAGE_COUNTS, 0)
        return sse(orjson.dumps(chunk))

    def _envelope(self) -> dict[str, Any]:
        identity = self.sent.identity or {}
        return {
            "id": identity.get("id"),
            "object": "chat.completion.chunk",
            "created": identity.get("created"),
            "model": identity.get("model"),
            "system_fingerprint": identity.get("system_fingerprint"),
        }

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None, logprobs: Any = None
    ) -> dict[str, Any]:
        chunk = self._envelope()
        chunk["choices"] = [
            {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        ]
        return chunk

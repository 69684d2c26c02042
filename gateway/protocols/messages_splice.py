"""The Messages client stream: one answer spliced from one or more upstream legs (section 2a).

Pure, like the other splicers: upstream events in, client events out, and a record
of what was sent in the run's ``MessagesAccumulator`` (``messages_items``). See
``gateway.protocols.messages`` for what the client is promised and the rest of the
adapter.

Text blocks stream as they come. Every other block (``tool_use``, ``thinking``,
``redacted_thinking``, a server tool's) is held until the upstream stops it, then
released whole: start, deltas, stop. So a client never holds half a tool call, nor a
thinking block without its signature.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.protocols.messages_items import THINKING, TOOL_USES, Block, MessagesAccumulator
from gateway.recovery.accumulator import ToolCall
from gateway.recovery.events import Chunk
from gateway.recovery.legs import Legs

MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def frame(kind: str, payload: bytes) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"


def render(obj: dict[str, Any]) -> bytes:
    return frame(str(obj["type"]), orjson.dumps(obj))


class MessagesSplicer(Legs):
    def __init__(self, accumulator: MessagesAccumulator) -> None:
        super().__init__(accumulator)
        self.sent: MessagesAccumulator = accumulator
        # This leg's block index -> the client's block (None: not sent, e.g. thinking
        # again). A held block is in ``_held`` until it stops; a later leg's new text
        # block in ``_pending`` until it has something to show past the seam.
        self._map: dict[int, Block | None] = {}
        self._held: dict[int, list[dict[str, Any]]] = {}
        self._pending: dict[int, dict[str, Any]] = {}
        self._ids: set[str] = {call.id for call in accumulator.tool_calls}

    # -- what recovery needs to know -------------------------------------------------

    def restore(self, leg: int, in_flight: list[str]) -> None:
        super().restore(leg, in_flight)
        self._ids = {call.id for call in self.sent.tool_calls}

    def in_flight(self) -> list[str]:
        names = [_name(held) for held in self._held.values() if _type(held) == "tool_use"]
        return self._dropped + names

    def held_calls(self) -> list[tuple[str, str]]:
        held = self._held.values()
        return [
            (_name(events), _arguments(events)) for events in held if _type(events) == "tool_use"
        ]

    def holding(self) -> bool:
        return any(_type(held) == "tool_use" for held in self._held.values())

    def forget_leg(self) -> None:
        self._map.clear()
        self._held.clear()
        self._pending.clear()

    # -- events -----------------------------------------------------------------------

    def feed(self, chunk: Chunk) -> bytes | None:
        obj = chunk.obj
        kind = obj.get("type")
        if self.finished:
            return None
        if kind == "content_block_delta":
            index = obj.get("index")
            if type(index) is not int:
                return None
            block = self._map.get(index)
            if block is not None:
                return self._delta(chunk, block)
            if index in self._held:
                self._held[index].append(obj)
            elif index in self._pending:
                return self._pending_delta(obj, index)
            return None
        if kind == "content_block_start":
            return self._start(chunk)
        if kind == "content_block_stop":
            return self._stop(obj.get("index"))
        if kind == "message_start":
            return self._message_start(chunk)
        if kind == "message_delta":
            return self._message_delta(obj)
        return None  # ping (the gateway sends its own), or what the protocol may add

    def _message_start(self, chunk: Chunk) -> bytes | None:
        message = chunk.obj.get("message")
        if type(message) is not dict:
            return None
        sent = self.sent
        usage = message.get("usage")
        if type(usage) is dict:
            sent.add_usage(self.leg, usage)
        if sent.message is not None:
            return None  # a later leg's own identity: the client keeps the first
        sent.message = message
        sent.identity = {"id": message.get("id"), "model": message.get("model")}
        sent.role = "assistant"
        if b"\n" in chunk.data:
            return render(chunk.obj)
        return frame("message_start", chunk.data)

    def _start(self, chunk: Chunk) -> bytes | None:
        obj = chunk.obj
        index, block = obj.get("index"), obj.get("content_block")
        if type(index) is not int or type(block) is not dict:
            return None
        kind = block.get("type")
        sent = self.sent
        if kind == "text":
            if self.leg > 0:
                client = sent.open_text()
                if client is not None:  # the continuation's text goes on in the client's
                    self._map[index] = client
                else:
                    self._pending[index] = block
                return None
            client = self._new_block(block)
            self._map[index] = client
            return self._emit(chunk, client)
        if kind in THINKING and self.leg > 0 and sent.blocks:
            self._map[index] = None  # the client has its thinking, and more after it
            return None
        self._held[index] = [obj]
        return None

    def _new_block(self, block: dict[str, Any]) -> Block:
        sent = self.sent
        client = Block(len(sent.blocks), str(block.get("type")), block)
        sent.blocks.append(client)
        return client

    def _delta(self, chunk: Chunk, block: Block) -> bytes | None:
        obj = chunk.obj
        delta = obj.get("delta")
        if type(delta) is not dict:
            return None
        if delta.get("type") == "text_delta":
            text = delta.get("text")
            if type(text) is not str:
                return None
            if self.seam is not None:
                text = self.seam.feed(text)
                if not text:
                    return None
            block.text.append(text)
            self.sent.add_text(text)
            if text != delta["text"]:
                return self._text_delta(block, text)
        elif delta.get("type") == "citations_delta":
            block.citations.append(delta.get("citation"))
        return self._emit(chunk, block)

    def _pending_delta(self, obj: dict[str, Any], index: int) -> bytes | None:
        """A delta of a later leg's new text block that has shown nothing yet."""
        delta = obj.get("delta")
        text = delta.get("text") if type(delta) is dict else None
        if type(text) is not str:
            return None
        if self.seam is not None:
            text = self.seam.feed(text)
        return self._release_pending(index, text) if text else None

    def _release_pending(self, index: int, text: str) -> bytes:
        out = self._close_open()
        client = self._new_block(self._pending.pop(index))
        self._map[index] = client
        client.text.append(text)
        self.sent.add_text(text)
        start = {
            "type": "content_block_start",
            "index": client.index,
            "content_block": client.start,
        }
        return out + render(start) + self._text_delta(client, text)

    def _stop(self, index: Any) -> bytes | None:
        if type(index) is not int:
            return None
        if index in self._held:
            return self._release(self._held.pop(index))
        if index in self._pending:
            rest = self.seam.flush() if self.seam is not None else ""
            if not rest:  # it said nothing new: never shown
                del self._pending[index]
                self._map[index] = None
                return None
            return self._release_pending(index, rest) + self._close(self.sent.blocks[-1])
        block = self._map.get(index)
        return None if block is None else self._close(block)

    def _close_open(self) -> bytes:
        """Stop the client's open text block, if it has one."""
        block = self.sent.open_text()
        return b"" if block is None else self._close(block)

    def _close(self, block: Block) -> bytes:
        """Stop a client text block, with what its seam still held."""
        if block.stopped:
            return b""
        out = b""
        if self.seam is not None:
            rest = self.seam.flush()
            if rest:
                block.text.append(rest)
                self.sent.add_text(rest)
                out = self._text_delta(block, rest)
        block.stopped = True
        return out + render({"type": "content_block_stop", "index": block.index})

    def _release(self, events: list[dict[str, Any]]) -> bytes:
        """A held block, stopped upstream: sent whole under its client index, after the
        client's open text block is stopped (a later leg's first block may not be text)."""
        start = events[0]["content_block"]
        kind = start.get("type")
        sent = self.sent
        out = self._close_open()
        if kind == "tool_use":
            start = self._tool_use(start, _arguments(events))
        client = self._new_block(start)
        client.stopped = True
        out += render(
            {"type": "content_block_start", "index": client.index, "content_block": start}
        )
        for event in events[1:]:
            delta = event.get("delta")
            if type(delta) is not dict:
                continue
            if kind == "thinking":
                if delta.get("type") == "thinking_delta":
                    thinking = str(delta.get("thinking") or "")
                    client.text.append(thinking)
                    sent.add_reasoning("thinking", thinking)
                elif delta.get("type") == "signature_delta":
                    client.signature = str(delta.get("signature") or "")
            elif delta.get("type") == "input_json_delta":
                client.json.append(str(delta.get("partial_json") or ""))
            out += render(event | {"index": client.index})
        if kind == "thinking" and client.signature is None:
            client.signature = start.get("signature") or ""
        return out + render({"type": "content_block_stop", "index": client.index})

    def _tool_use(self, start: dict[str, Any], arguments: str) -> dict[str, Any]:
        """A tool use as the client gets it: its id unique in the answer, recorded."""
        sent = self.sent
        call_id = start.get("id")
        call_id = call_id if type(call_id) is str and call_id else f"toolu_{len(sent.tool_calls)}"
        if call_id in self._ids:  # a later leg reused an id the client already has
            call_id = f"{call_id}_{len(sent.tool_calls)}"
        self._ids.add(call_id)
        name = str(start.get("name") or "")
        sent.tool_calls.append(ToolCall(len(sent.tool_calls), call_id, name, arguments))
        return start | {"id": call_id}

    def _message_delta(self, obj: dict[str, Any]) -> bytes:
        usage = obj.get("usage")
        if type(usage) is dict:
            self.sent.add_usage(self.leg, usage)
        delta = obj.get("delta")
        delta = delta if type(delta) is dict else {}
        reason = delta.get("stop_reason")
        return self._finish(reason if type(reason) is str else "end_turn", delta)

    def _finish(self, reason: str, delta: dict[str, Any], *, upstream: bool = True) -> bytes:
        """Stop what the client has open, then the one message_delta.

        ``upstream``: the upstream's message_delta, which a server that does not stop
        every block first may send while a block is held: those that are whole go out.
        """
        sent = self.sent
        out = b""
        if upstream:
            for events in self._held.values():
                if _whole(events):
                    out += self._release(events)
        self._held.clear()
        out += b"".join(self._close(block) for block in sent.blocks if not block.stopped)
        sent.finish_reason = reason
        sent.stop_sequence = delta.get("stop_sequence")
        self.finished = True
        message_delta = {
            "type": "message_delta",
            "delta": delta | {"stop_reason": reason, "stop_sequence": sent.stop_sequence},
            "usage": sent.usage or {"output_tokens": 0},
        }
        return out + render(message_delta)

    def synthesize_tool_use(self) -> bytes:
        """End the answer with the tool uses the client has (SynthesizeToolUse)."""
        return self._finish("tool_use", {}, upstream=False)

    def end_at_budget(self) -> bytes:
        """End the answer where its ``max_tokens`` ran out (FinishAtBudget)."""
        return self._finish("max_tokens", {}, upstream=False)

    def close(self) -> bytes:
        return MESSAGE_STOP

    def fail(self, error: GatewayError) -> bytes:
        out = b""
        if self.sent.message is not None:  # every block the client saw start, stopped
            out = b"".join(self._close(b) for b in self.sent.blocks if not b.stopped)
        self.finished = True
        return out + error_event(error)

    # -- output -----------------------------------------------------------------------

    def _emit(self, chunk: Chunk, block: Block) -> bytes:
        """``chunk`` for the client's ``block``: the bytes received when its index is the
        client's (the first leg, as a rule)."""
        obj = chunk.obj
        if obj.get("index") == block.index and b"\n" not in chunk.data:
            return frame(obj["type"], chunk.data)
        return render(obj | {"index": block.index})

    @staticmethod
    def _text_delta(block: Block, text: str) -> bytes:
        delta = {"type": "text_delta", "text": text}
        return render({"type": "content_block_delta", "index": block.index, "delta": delta})


def error_type(error: GatewayError) -> str:
    """Anthropic's name for what ended a stream: a refusal the upstream made is the
    client's to fix (``invalid_request_error``); an overload says so; else ``api_error``."""
    if getattr(error, "fatal", False) or error.error_type == "invalid_request_error":
        return "invalid_request_error"
    if error.error_type == "authentication_error":
        return "authentication_error"
    if "overload" in error.message.lower():
        return "overloaded_error"
    return "api_error"


def error_event(error: GatewayError) -> bytes:
    body = {"type": error_type(error), "message": error.message}
    return render({"type": "error", "error": body})


def _type(events: list[dict[str, Any]]) -> Any:
    return events[0]["content_block"].get("type")


def _name(events: list[dict[str, Any]]) -> str:
    name = events[0]["content_block"].get("name")
    return name if type(name) is str and name else "unnamed tool"


def _arguments(events: list[dict[str, Any]]) -> str:
    """A tool use's input as JSON: its input_json_deltas, else the input its start gave."""
    streamed = "".join(_partial_json(events))
    if streamed:
        return streamed
    given = events[0]["content_block"].get("input")
    return orjson.dumps(given).decode() if type(given) is dict and given else ""


def _whole(events: list[dict[str, Any]]) -> bool:
    """Whether a held block that was never stopped is whole all the same: a thinking
    block with its signature, a tool use whose input parses."""
    kind = _type(events)
    if kind == "thinking":
        deltas = [e.get("delta") for e in events[1:]]
        return any(type(d) is dict and d.get("type") == "signature_delta" for d in deltas)
    if kind in TOOL_USES:
        try:
            orjson.loads(_arguments(events) or "{}")
        except orjson.JSONDecodeError:
            return False
        return True
    return bool(kind == "redacted_thinking")


def _partial_json(events: list[dict[str, Any]]) -> list[str]:
    parts = []
    for event in events[1:]:
        delta = event.get("delta")
        if type(delta) is dict and delta.get("type") == "input_json_delta":
            parts.append(str(delta.get("partial_json") or ""))
    return parts

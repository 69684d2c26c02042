"""The Responses client stream: one answer spliced from one or more upstream legs (section 2a).

Pure, like the chat splicer: upstream events in, client events out, and a record of
what was sent in the run's ``ResponsesAccumulator`` (``responses_items``). See
``gateway.protocols.responses`` for what the client is promised and the rest of the
adapter.

Messages stream as they come. Every other item an agent sends back on its next turn
(``function_call``, ``reasoning``) is held until the upstream says it is done, then
released whole: added, its deltas, done (ARCHITECTURE.md section 6b rule 2). So a
client never holds half a function call, nor a reasoning item without the
``encrypted_content`` its done event carries (``store: false`` clients send it back,
and a provider refuses a reasoning item it cannot read). The cost: a reasoning
summary reaches the client when its item is done, not delta by delta. Items go out
strictly one after another: a held item is released only after the client's open
message (a continuation's) is closed.

Past 450 lines on purpose: ``ResponsesSplicer`` is one state machine over the event
kinds (lifecycle, items added, their events, held items, terminal), and its cases
read best side by side.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import GatewayError, UpstreamFailure
from gateway.protocols.responses_items import Item, ResponsesAccumulator
from gateway.recovery.accumulator import ToolCall
from gateway.recovery.events import Chunk
from gateway.recovery.legs import Legs
from gateway.recovery.plan import Position

# Events that carry the whole response object: the first leg's are the client's.
LIFECYCLE = frozenset({"response.created", "response.in_progress", "response.queued"})
TERMINAL = frozenset({"response.completed", "response.incomplete"})
TEXT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
    }
)
_REASONING_DELTAS = frozenset(
    {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}
)
# The events of an output item that name a content part (``content_index``).
_CONTENT_EVENTS = frozenset(
    {
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.delta",
        "response.refusal.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    }
)
# Events of an output item: OpenAI's carry its ``output_index``. Some servers' do not
# (llama.cpp's ``llama-server`` sends no ``output_index``, ``content_index`` nor
# ``sequence_number``): such an event is placed by its ``item_id``, else in the item added
# last (``ResponsesSplicer._placed_by_id``). An event with an ``item_id`` is one too.
ITEM_EVENTS = _CONTENT_EVENTS | {
    "response.output_item.added",
    "response.output_item.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_part.done",
    "response.reasoning_summary_text.delta",
    "response.reasoning_summary_text.done",
}
# Events of a message item that the gateway renders itself from the client's text.
_MESSAGE_DONE = frozenset(
    {"response.output_text.done", "response.content_part.done", "response.output_item.done"}
)


def frame(kind: str, payload: bytes) -> bytes:
    head = _HEADS.get(kind)
    if head is None:  # not a kind the gateway knows: not kept (an upstream chooses them)
        head = b"event: " + kind.encode() + b"\ndata: "
    return head + payload + b"\n\n"


# A background response's events are renumbered one by one (``_emit``): the numbers of
# an answer of up to 4,096 events, encoded once (200 KB), halve what that costs a delta.
_NUMBERED = tuple(b'"sequence_number":%d' % number for number in range(4096))
# Each known kind's ``event:`` line and ``data:`` prefix, encoded once.
_HEADS = {
    kind: b"event: " + kind.encode() + b"\ndata: "
    for kind in LIFECYCLE | TERMINAL | ITEM_EVENTS | {"response.failed", "error"}
}


@dataclass(slots=True)
class Held:
    """An item of the current leg (a function call, a reasoning item), held until its
    output_item.done."""

    events: list[dict[str, Any]]

    @property
    def type(self) -> Any:
        item = self.events[0].get("item")
        return item.get("type") if type(item) is dict else None


class ResponsesSplicer(Legs):
    def __init__(
        self,
        accumulator: ResponsesAccumulator,
        *,
        model: str | None,
        replaying: bool = False,
        background: bool = False,
    ) -> None:
        super().__init__(accumulator)
        self.sent: ResponsesAccumulator = accumulator
        self._model = model
        # Whether the client asked for a background response itself; if not, one the
        # gateway asked for is shown as the response the client asked for: its own
        # ``background``, ``in_progress`` from the start, no ``response.queued``.
        self._background = background
        # The open leg's background response (None: not one), and its last event
        # received, whose number is where it is read again after a break (``resumable``).
        self._upstream_id: str | None = None
        self._last: dict[str, Any] = {}
        # Rebuilding a client's view from its own events: what it was sent is what it has,
        # reasoning included (a log from before reasoning was held may end inside one).
        self._held_types = ("function_call",) if replaying else ("function_call", "reasoning")
        # This leg's output_index -> the client's item (None: not sent, e.g. reasoning
        # again); a function call is absent until it is released.
        self._map: dict[int, Item | None] = {}
        self._continued: set[int] = set()  # this leg's message items continuing the client's
        # A later leg's new message, held (added, part added) until it has text to show:
        # a continuation that only repeats the anchor must not leave an empty message.
        self._pending: dict[int, list[dict[str, Any]]] = {}
        self._held: dict[int, Held] = {}
        self._ids: set[str] = {item.id for item in accumulator.items}
        # Where this leg's events without an output_index go (``_placed_by_id``): its
        # items by the ids they are named by, the one added last, the index the next
        # one added without an index gets, and each item's content parts so far.
        self._upstream_ids: dict[str, int] = {}
        self._last_added: int | None = None
        self._next_index = 0
        self._parts: dict[int, int] = {}

    # -- what recovery needs to know (as the chat splicer) ----------------------------

    def restore(self, leg: int, in_flight: list[str]) -> None:
        super().restore(leg, in_flight)
        self._ids = {item.id for item in self.sent.items}
        self._ids |= {call.id for call in self.sent.tool_calls}

    def _held_calls(self) -> list[Held]:
        return [held for held in self._held.values() if held.type == "function_call"]

    def in_flight(self) -> list[str]:
        return self._dropped + [_call_name(held) for held in self._held_calls()]

    def held_calls(self) -> list[tuple[str, str]]:
        return [(_call_name(held), _call_arguments(held)) for held in self._held_calls()]

    def holding(self) -> bool:
        return bool(self._held_calls())

    def resumable(self) -> Position | None:
        number = self._last.get("sequence_number")
        if self.finished or self._upstream_id is None or type(number) is not int:
            return None
        return Position(self._upstream_id, number)

    def forget_leg(self) -> None:
        self._upstream_id, self._last = None, {}
        self._held.clear()
        self._map.clear()
        self._continued.clear()
        self._pending.clear()
        self._upstream_ids.clear()
        self._last_added = None
        self._next_index = 0
        self._parts.clear()

    # -- events -----------------------------------------------------------------------

    def feed(self, chunk: Chunk) -> bytes | None:
        obj = chunk.obj
        kind = obj.get("type")
        if type(kind) is not str or self.finished:
            return None
        self._last = obj
        index = obj.get("output_index")
        if type(index) is int:
            if index in self._held:
                return self._hold(index, obj)
            if index in self._pending:
                return self._pending_event(chunk, kind, index)
            item = self._map.get(index, _UNSEEN)
            if item is None:
                return None  # an item the client is not sent (reasoning again)
            if item is not _UNSEEN:
                if item.type == "message":  # the hot path: a text delta
                    return self._message_event(chunk, kind, index, item)
                return self._item_event(chunk, kind, index, item)
            if kind == "response.output_item.added":
                self._opened(index, obj)
                return self._added(chunk, index)
            return None  # an event for an item that was never added: nothing to attach it to
        if kind in LIFECYCLE:
            return self._lifecycle(chunk, kind)
        if kind in TERMINAL:
            return self._terminal(obj, kind)
        if kind in ITEM_EVENTS or "item_id" in obj:  # an item's, without its output_index
            return self._placed_by_id(chunk, kind)
        if self.leg == 0:  # anything else of the response itself: as it came
            return self._emit(chunk, obj)
        return None

    def _lifecycle(self, chunk: Chunk, kind: str) -> bytes | None:
        sent = self.sent
        response = chunk.obj.get("response")
        if type(response) is not dict:
            return None
        if kind == "response.created":  # every leg's: is it one to read again after a break?
            name = response.get("id")
            if response.get("background") is True and type(name) is str and name:
                self._upstream_id = name
        if not self._background:
            if kind == "response.queued":
                return None  # the gateway's background response: not the client's
            response = self._as_asked(response)
        if sent.response is None:
            obj = chunk.obj
            if response is not obj["response"]:
                obj = obj | {"response": response}
            if response.get("created_at") is None or response.get("model") is None:
                # A server that leaves them out (llama.cpp's): the gateway's, as in ``fail``.
                response = response | {
                    "created_at": response.get("created_at") or int(time.time()),
                    "model": response.get("model") or self._model,
                }
                obj = obj | {"response": response}
            sent.response = response | {"output": [], "usage": None}
            sent.identity = {k: response.get(k) for k in ("id", "created_at", "model")}
            sent.role = "assistant"
            return self._emit(chunk, obj)
        if self.leg == 0 and kind != "response.created":
            return self._emit(chunk, chunk.obj | {"response": self._client_response(response)})
        return None  # a later leg's own identity: the client keeps the first

    def _client_response(self, response: dict[str, Any]) -> dict[str, Any]:
        identity = self.sent.identity or {}
        return response | identity

    @staticmethod
    def _as_asked(response: dict[str, Any]) -> dict[str, Any]:
        """A background response the gateway asked for, as the client's request would
        have had it: not background, generating from the start (never ``queued``)."""
        if response.get("background") is not True:
            return response
        status = response.get("status")
        return response | {
            "background": False,
            "status": "in_progress" if status == "queued" else status,
        }

    # -- events without an output_index (a server's dialect) --------------------------

    def _opened(self, index: int, obj: dict[str, Any]) -> None:
        """This leg's item ``index`` was added: an event without an output_index that
        names it (``item_id``), or names none, goes to it."""
        self._last_added = index
        if index >= self._next_index:
            self._next_index = index + 1
        item = obj.get("item")
        if type(item) is dict:
            name = item.get("id")
            if type(name) is str and name:
                self._upstream_ids[name] = index
            # llama.cpp's function call has no id: its events name it by its call_id.
            call_id = item.get("call_id")
            if type(call_id) is str and call_id:
                self._upstream_ids.setdefault(call_id, index)

    def _placed_by_id(self, chunk: Chunk, kind: str) -> bytes | None:
        """An item's event without its ``output_index`` (llama.cpp's server sends none, nor
        a ``content_index`` or ``sequence_number``), spliced as OpenAI's would be: in the
        item its ``item_id`` names (llama.cpp closes its items only at the end, each by
        name), else the item added last; a missing ``content_index`` is that item's
        current content part. So what the client is given is counted as sent whatever
        the dialect. An event no open item can take ends the answer with the explicit
        error (``UpstreamFailure``): never text the gateway did not count."""
        obj = chunk.obj
        if kind == "response.output_item.added":
            index = self._next_index
        else:
            if self._last_added is None and kind in _MESSAGE_DONE:
                self._adopt(obj)
            index = self._item_of(obj, kind)
        # No sequence_number: the event is rendered in the client's numbering, never
        # passed through as received (it lacks what the client reads).
        fields: dict[str, Any] = {"output_index": index, "sequence_number": None}
        if kind in _CONTENT_EVENTS and type(obj.get("content_index")) is not int:
            parts = self._parts.get(index, 0)
            if kind == "response.content_part.added":
                self._parts[index] = parts + 1
                fields["content_index"] = parts
            else:
                fields["content_index"] = max(parts - 1, 0)
        # What OpenAI's events always carry and the SDKs' types require.
        if kind in ("response.output_text.delta", "response.output_text.done"):
            if "logprobs" not in obj:
                fields["logprobs"] = []
        elif kind == "response.content_part.added":
            part = obj.get("part")
            if type(part) is dict and part.get("type") == "output_text":
                fields["part"] = {"annotations": []} | part
        return self.feed(Chunk(chunk.data, obj | fields))

    def _adopt(self, obj: dict[str, Any]) -> None:
        """A continuation that had nothing to add: llama.cpp then adds no item and sends
        only the done events of one, saying the prefix it was given. On a later leg whose
        client message is not closed yet (its text may have been said done before the
        break), that item is taken as the client's message, as any continuation's is: its
        done events close the message once, with the text the client was streamed."""
        message = next((i for i in reversed(self.sent.items) if i.type == "message"), None)
        if self.leg == 0 or message is None or message.done is not None:
            return
        item = obj.get("item")
        name = item.get("id") if type(item) is dict else obj.get("item_id")
        if type(name) is not str:
            return
        index = self._next_index
        self._opened(index, {"item": {"id": name}})
        self._map[index] = message
        self._continued.add(index)

    def _item_of(self, obj: dict[str, Any], kind: str) -> int:
        """The index of this leg's item an event without an output_index belongs to."""
        name = obj.get("item_id")
        if kind == "response.output_item.done":
            item = obj.get("item")
            if type(item) is dict:
                name = item.get("id") or item.get("call_id") or name
        index = self._upstream_ids.get(name) if type(name) is str else None
        if index is not None:
            return index
        index = self._last_added
        if index is not None:
            item = self._map.get(index)
            if item is None or item.done is None:  # held, pending, not sent, or open
                return index
        chars = self.sent.text_chars
        after = f" (after {chars} characters of the answer)" if chars else ""
        raise UpstreamFailure(
            f"The upstream sent a {kind!r} event without an output_index outside any "
            f"output item it had added, which the gateway cannot place{after}; the "
            "answer is incomplete.",
            code="upstream_bad_response",
        )

    def _added(self, chunk: Chunk, index: int) -> bytes | None:
        obj = chunk.obj
        item = obj.get("item")
        if type(item) is not dict:
            return None
        kind = item.get("type")
        sent = self.sent
        if kind == "reasoning" and self.leg > 0 and sent.items:
            # A continuation's (or a restart's) reasoning: the client has its answer's
            # reasoning, or output after which new reasoning would be out of place.
            self._map[index] = None
            return None
        if kind in self._held_types:
            self._held[index] = Held([obj])
            return None
        if kind == "message":
            open_message = sent.open_message()
            if open_message is not None and self.leg > 0:
                # The continuation's text goes on in the message the client has open.
                self._map[index] = open_message
                self._continued.add(index)
                return None
            if self.leg > 0:
                self._pending[index] = [obj]
                return None
        out = self._close_messages() if self.leg > 0 else b""
        client = self._new_item(item)
        self._map[index] = client
        if kind == "message":
            client.added = client.added | {"content": []}
        added = obj | {"output_index": client.index, "item": client.added}
        return out + self._emit(chunk, added)

    def _new_item(self, item: dict[str, Any]) -> Item:
        sent = self.sent
        item_id = item.get("id")
        item_id = item_id if type(item_id) is str and item_id else f"item_{len(sent.items)}"
        if item_id in self._ids:  # a later leg reused an id the client already has
            item_id = f"{item_id}_{len(sent.items)}"
        self._ids.add(item_id)
        client = Item(len(sent.items), item_id, str(item.get("type")), item | {"id": item_id})
        sent.items.append(client)
        return client

    def _item_event(self, chunk: Chunk, kind: str, index: int, item: Item) -> bytes | None:
        """An event of a sent item other than a message (``_message_event``)."""
        obj = chunk.obj
        if kind in _REASONING_DELTAS:
            delta = obj.get("delta")
            if type(delta) is str and delta:
                self.sent.add_reasoning("reasoning", delta)
                item.add_summary(obj.get("summary_index"), delta)
        elif kind == "response.output_item.done":
            done = obj.get("item")
            if type(done) is dict:
                item.done = done | {"id": item.id}
                return self._emit(chunk, obj | {"output_index": item.index, "item": item.done})
        return self._emit(chunk, self._placed(obj, item))

    def _message_event(self, chunk: Chunk, kind: str, index: int, item: Item) -> bytes | None:
        obj = chunk.obj
        if kind == "response.output_text.delta":
            delta = obj.get("delta")
            if type(delta) is not str:
                return None
            if self.seam is not None:
                delta = self.seam.feed(delta)
            if not delta:
                return None
            item.text.append(delta)
            self.sent.add_text(delta)
            if delta != obj["delta"]:
                obj = obj | {"delta": delta}
            if obj.get("output_index") != item.index or obj.get("item_id") != item.id:
                obj = self._placed(obj, item)  # a later leg's, moved to the client's item
            return self._emit(chunk, obj)
        if kind == "response.refusal.delta":
            delta = obj.get("delta")
            if type(delta) is str:
                item.refusal.append(delta)
                self.sent.add_refusal(delta)
            return self._emit(chunk, self._placed(obj, item))
        if kind == "response.content_part.added":
            if index in self._continued and item.parts:
                return None  # the client's part goes on
            item.parts += 1
            return self._emit(chunk, self._placed(obj, item))
        if kind in _MESSAGE_DONE:
            return self._message_done(obj, kind, item)
        return self._emit(chunk, self._placed(obj, item))

    def _message_done(self, obj: dict[str, Any], kind: str, item: Item) -> bytes | None:
        """A message's done events, with the whole text the client has."""
        out = b""
        if kind == "response.output_text.done" and self.seam is not None:
            rest = self.seam.flush()
            if rest:  # held at the seam: released before the text is said to be done
                item.text.append(rest)
                self.sent.add_text(rest)
                out += self._render(self._text_delta(item, rest))
        text = "".join(item.text)
        placed = self._placed(obj, item)
        if kind == "response.output_text.done":
            if item.text_done:
                return out or None  # said already, before a break
            item.text_done = True
            placed["text"] = text
        elif kind == "response.content_part.done":
            if item.part_done:
                return out or None
            item.part_done = True
            part = placed.get("part")
            if type(part) is dict and part.get("type") == "output_text":
                placed["part"] = part | {"text": text}
        else:
            if item.done is not None:
                # Closed already, with its text: an item the upstream said done after the
                # next one (llama.cpp says every item done at the end) was released.
                return out or None
            item.done = item.message("completed")
            placed["item"] = item.done
        return out + self._render(placed)

    def _pending_event(self, chunk: Chunk, kind: str, index: int) -> bytes | None:
        """An event of a later leg's new message that has shown no text yet."""
        obj, pending = chunk.obj, self._pending[index]
        if kind == "response.content_part.added":
            pending.append(obj)
            return None
        text = ""
        if kind == "response.output_text.delta":
            delta = obj.get("delta")
            text = delta if type(delta) is str else ""
            if self.seam is not None:
                text = self.seam.feed(text)
        elif kind == "response.output_text.done" and self.seam is not None:
            text = self.seam.flush()
        if not text and kind != "response.refusal.delta":
            if kind == "response.output_item.done":  # it said nothing new: never shown
                del self._pending[index]
                self._map[index] = None
            return None
        # Something to show at last: the item, its part, then this event, after the
        # client's message (said done with its text before a break) is closed. What the
        # seam holds is this message's: it stays.
        del self._pending[index]
        out = self._close_messages(seam=False)
        item = self._new_item(pending[0]["item"])
        item.added = item.added | {"content": []}
        self._map[index] = item
        out += self._render(pending[0] | {"output_index": item.index, "item": item.added})
        for part in pending[1:]:
            item.parts += 1
            out += self._render(self._placed(part, item))
        if kind == "response.output_text.delta":
            item.text.append(text)
            self.sent.add_text(text)
            return out + self._render(self._placed(obj | {"delta": text}, item))
        if text:  # released by the seam as the text ended
            item.text.append(text)
            self.sent.add_text(text)
            out += self._render(self._text_delta(item, text))
        return out + (self._message_event(chunk, kind, index, item) or b"")

    def _text_delta(self, item: Item, delta: str) -> dict[str, Any]:
        return {
            "type": "response.output_text.delta",
            "item_id": item.id,
            "output_index": item.index,
            "content_index": 0,
            "delta": delta,
            "logprobs": [],
        }

    def _hold(self, index: int, obj: dict[str, Any]) -> bytes | None:
        held = self._held[index]
        held.events.append(obj)
        if obj.get("type") != "response.output_item.done":
            return None
        del self._held[index]
        done = obj.get("item")
        added = held.events[0].get("item")
        if type(done) is not dict or type(added) is not dict:
            return None
        out = self._close_messages()
        if held.type == "function_call":
            item = self._function_call(added, done)
        else:
            item = self._new_item(added)
            item.done = done | {"id": item.id}
        self._map[index] = item
        for event in held.events:
            kind = event.get("type")
            if kind == "response.output_item.added":
                event = event | {"item": item.added}
            elif kind == "response.output_item.done":
                event = event | {"item": item.done}
            elif kind in _REASONING_DELTAS:
                delta = event.get("delta")
                if type(delta) is str and delta:
                    self.sent.add_reasoning("reasoning", delta)
                    item.add_summary(event.get("summary_index"), delta)
            out += self._render(self._placed(event, item))
        return out

    def _function_call(self, added: dict[str, Any], done: dict[str, Any]) -> Item:
        """A function call as the client gets it: its ids unique in the answer, recorded."""
        sent = self.sent
        item = self._new_item(added | {"arguments": ""})
        call_id = done.get("call_id")
        call_id = call_id if type(call_id) is str and call_id else f"call_{len(sent.tool_calls)}"
        if any(call.id == call_id for call in sent.tool_calls):
            call_id = f"{call_id}_{len(sent.tool_calls)}"
        item.added = item.added | {"call_id": call_id}
        item.done = done | {"id": item.id, "call_id": call_id}
        name, arguments = str(done.get("name") or ""), str(done.get("arguments") or "")
        sent.tool_calls.append(ToolCall(len(sent.tool_calls), call_id, name, arguments))
        return item

    def _close_messages(self, *, seam: bool = True) -> bytes:
        """Close the client's open message (with what the seam still held for it, unless
        ``seam`` is False), so that the next item starts after it: items go out one
        after another."""
        out = b""
        for item in self.sent.items:
            if item.type != "message" or item.done is not None:
                continue
            if seam and self.seam is not None:
                rest = self.seam.flush()
                if rest:
                    item.text.append(rest)
                    self.sent.add_text(rest)
                    out += self._render(self._text_delta(item, rest))
            out += self._close_message(item)
        return out

    def _placed(self, obj: dict[str, Any], item: Item) -> dict[str, Any]:
        """``obj`` moved to the client's item: its output_index and item_id."""
        if obj.get("output_index") == item.index and obj.get("item_id", item.id) == item.id:
            return obj
        placed = obj | {"output_index": item.index}
        if "item_id" in obj:
            placed["item_id"] = item.id
        return placed

    def _terminal(self, obj: dict[str, Any], kind: str) -> bytes:
        response = obj.get("response")
        response = response if type(response) is dict else {}
        usage = response.get("usage")
        if type(usage) is dict:
            self.sent.set_usage(self.leg, usage)
        status = "incomplete" if kind == "response.incomplete" else "completed"
        self.sent.incomplete_details = response.get("incomplete_details")
        return self._finish(status)

    def _finish(self, status: str) -> bytes:
        """Close what the client has open, then the one terminal event."""
        out = self._close_messages()
        for item in self.sent.items:
            if item.done is None:  # none but a message is ever sent open: a safeguard
                item.done = item.final()
                out += self._render(
                    {
                        "type": "response.output_item.done",
                        "output_index": item.index,
                        "item": item.done,
                    }
                )
        self.sent.status = status
        self.sent.finish_reason = "tool_calls" if self.sent.tool_calls else "stop"
        if status == "incomplete":
            self.sent.finish_reason = "length"
        self.finished = True
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._render({"type": kind, "response": self.sent.response_object(status)})

    def _close_message(self, item: Item) -> bytes:
        text = "".join(item.text)
        base = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        out = b""
        if item.parts and not item.text_done:
            item.text_done = True
            out += self._render(
                base | {"type": "response.output_text.done", "text": text, "logprobs": []}
            )
        if item.parts and not item.part_done:
            item.part_done = True
            part = {"type": "output_text", "text": text, "annotations": []}
            out += self._render(base | {"type": "response.content_part.done", "part": part})
        item.done = item.message("completed")
        done = {"type": "response.output_item.done", "output_index": item.index}
        return out + self._render(done | {"item": item.done})

    def synthesize_tool_use(self) -> bytes:
        """End the answer with the function calls the client has (SynthesizeToolUse)."""
        self._held.clear()
        return self._finish("completed")

    def end_at_budget(self) -> bytes:
        """End the answer where its ``max_output_tokens`` ran out (FinishAtBudget): the
        ``response.incomplete`` the unbroken answer would have ended with."""
        self._held.clear()
        self.sent.incomplete_details = {"reason": "max_output_tokens"}
        return self._finish("incomplete")

    def close(self) -> bytes:
        return b""  # the terminal event went out with the answer's end

    def fail(self, error: GatewayError) -> bytes:
        sent, out = self.sent, b""
        if sent.response is None:
            # Nothing was sent: a response of the gateway's own, created so that a client
            # (the SDK's stream helper expects response.created first) reads the failure.
            sent.response = {
                "id": f"resp_{uuid.uuid4().hex}",
                "object": "response",
                "created_at": int(time.time()),
                "status": "in_progress",
                "model": self._model,
                "output": [],
            }
            sent.identity = {k: sent.response[k] for k in ("id", "created_at", "model")}
            created = {"type": "response.created", "response": sent.response}
            out = self._render(created)
        body = error.body()["error"]
        failed = sent.response_object("failed")
        failed["error"] = {"code": body.get("code") or "server_error", "message": body["message"]}
        event = {
            "type": "error",
            "code": body.get("code"),
            "message": body["message"],
            "param": None,
        }
        self.finished = True
        return (
            out
            + self._render(event)
            + self._render({"type": "response.failed", "response": failed})
        )

    # -- output -----------------------------------------------------------------------

    def _emit(self, chunk: Chunk, obj: dict[str, Any]) -> bytes:
        """``obj`` as the client's next event: the bytes received when nothing changed but,
        at most, its number (a background response's ``response.queued`` is not shown, so
        its later events are one behind): then that is changed in place."""
        sent = self.sent
        data = chunk.data
        if obj is chunk.obj and self.leg == 0 and b"\n" not in data:  # one data: line
            number = obj.get("sequence_number")
            if number == sent.seq:
                sent.seq += 1
                return frame(obj["type"], data)
            if type(number) is int:
                # Outside a JSON string only a key reads so (a string escapes its quotes);
                # replace() gives ``data`` itself back when it is not there (spaced JSON).
                try:  # (a negative number finds nothing here either: rendered below)
                    said, numbered = _NUMBERED[number], _NUMBERED[sent.seq]
                except IndexError:
                    said = b'"sequence_number":%d' % number
                    numbered = b'"sequence_number":%d' % sent.seq
                renumbered = data.replace(said, numbered, 1)
                if renumbered is not data:
                    sent.seq += 1
                    return frame(obj["type"], renumbered)
        return self._render(obj)

    def _render(self, obj: dict[str, Any]) -> bytes:
        sent = self.sent
        obj = obj | {"sequence_number": sent.seq}
        sent.seq += 1
        return frame(str(obj.get("type")), orjson.dumps(obj))


_UNSEEN = Item(-1, "", "", {})


def _call_name(held: Held) -> str:
    item = held.events[0].get("item")
    name = item.get("name") if type(item) is dict else None
    return name if type(name) is str and name else "unnamed tool"


def _call_arguments(held: Held) -> str:
    parts = [e.get("delta") for e in held.events if e.get("type") in TEXT_DELTAS]
    return "".join(p for p in parts if type(p) is str)

"""The Responses adapter: ``POST /v1/responses`` (ARCHITECTURE.md section 2a).

Every client event is ``event: <type>`` + ``data: {"type": <type>, "sequence_number": n, …}``.
Whatever the legs do, the splicer keeps:

- one response identity (the first leg's ``id``, ``created_at``, ``model``): one
  ``response.created`` and one ``response.in_progress``;
- ``sequence_number`` 0, 1, 2… over all legs (renumbered as events go out);
- output items with one ``output_index`` and ``item_id`` each, contiguous from 0. A
  continuation's message continues the client's open message item (same id and
  index, its text seam-trimmed); a later leg's reasoning is not sent again;
- ``function_call`` and ``reasoning`` items released whole: added, their deltas and
  done (with a reasoning item's ``encrypted_content``), once the upstream says the item
  is done; a cut one never reaches the client. Items go out one after another;
- the ``*.done`` events and the terminal event's ``output`` carry the whole spliced
  text; exactly one terminal event, ``response.completed`` or ``response.incomplete``
  with usage summed over legs, or ``error`` + ``response.failed``.

Whatever the upstream's dialect: an item's event without ``output_index`` (llama.cpp's
server sends none, nor ``content_index`` or ``sequence_number``) is placed by its
``item_id``, else in the item added last, and counted as OpenAI's would be; one that
no item can take ends the answer with the explicit error.

Fast path: on the first leg, an event whose numbering and indices need no change
goes out as the bytes received, behind its ``event:`` line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.protocols.base import Adapter
from gateway.protocols.responses_items import ResponsesAccumulator
from gateway.protocols.responses_splice import TEXT_DELTAS, ResponsesSplicer, frame
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.events import DONE, Chunk, Event, InBandError, Malformed, decode
from gateway.upstream.continuation import ContinuationRequest, Continuing

# -- decoding ---------------------------------------------------------------------------


def parse_event(data: bytes) -> Event:
    if data == b"[DONE]":  # not in the protocol, but said by some servers
        return DONE
    event = decode(data)
    if type(event) is Malformed:
        return event
    assert type(event) is Chunk
    obj = event.obj
    kind = obj.get("type")
    if kind == "error":
        error = obj.get("error")  # some servers nest it, as in chat
        if type(error) is not dict:
            error = {k: obj.get(k) for k in ("code", "message", "param")}
        return InBandError(error)
    if kind == "response.failed":
        response = obj.get("response")
        error = response.get("error") if type(response) is dict else None
        if type(error) is not dict:
            error = {"message": "response failed", "code": "server_error"}
        return InBandError(error)
    return event


def delta_chars(chunk: Chunk) -> int:
    obj = chunk.obj
    if obj.get("type") in TEXT_DELTAS:
        delta = obj.get("delta")
        return len(delta) if type(delta) is str else 0
    return 0


# What a model sends once it answers: after these, no silent thinking is expected.
ANSWER_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    }
)


# -- continuation ----------------------------------------------------------------------


def input_items(body: dict[str, Any]) -> list[Any]:
    """The request's ``input`` as a list of items (a string is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def for_continuation(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` ready to be continued: ``input`` as a list of items. A
    ``previous_response_id`` stays: it is the conversation the answer continues (an
    agent's ``function_call_output`` items refer to calls it holds)."""
    return body | {"input": input_items(body)}


def typed_continuation(body: dict[str, Any], continued: ContinuationRequest) -> ContinuationRequest:
    """``continued`` with the items it added to ``body``'s ``input`` typed as messages:
    the type is optional in OpenAI's API, but a server may refuse an assistant item
    without it (llama.cpp's: "Cannot determine type of 'item'")."""
    items = continued.body.get("input")
    given = len(input_items(body))
    if not isinstance(items, list) or len(items) <= given:
        return continued
    added = [
        {"type": "message"} | item if isinstance(item, dict) and "role" in item else item
        for item in items[given:]
    ]
    return dataclasses.replace(continued, body=continued.body | {"input": items[:given] + added})


# -- replay and the assembled answer ----------------------------------------------------


def replay(events: list[bytes]) -> ResponsesAccumulator:
    """What a client assembled from the events it was sent (a takeover's starting point)."""
    accumulator = ResponsesAccumulator()
    # The client's own events: nothing in them is the gateway's to rewrite (a background
    # response among them is one the client asked for).
    splicer = ResponsesSplicer(accumulator, model=None, replaying=True, background=True)
    for event in events:
        data = event.partition(b"\ndata: ")[2].rstrip(b"\n")
        obj = orjson.loads(data) if data else None
        if type(obj) is not dict:
            continue
        kind = obj.get("type")
        if kind in ("error", "response.failed"):
            continue
        # The client's own events, fed back: they are already in its numbering.
        splicer.feed(Chunk(data, obj))
    accumulator.seq = len(events)
    return accumulator


class ResponsesAdapter(Adapter):
    name = "responses"
    path = "/responses"
    turns = "input"
    budget_fields = ("max_output_tokens",)
    format_field = ("text", "format")
    aliased = True

    def parse_event(self, data: bytes) -> Event:
        return parse_event(data)

    def delta_chars(self, chunk: Chunk) -> int:
        return delta_chars(chunk)

    def answers(self, chunk: Chunk) -> bool:
        return chunk.obj.get("type") in ANSWER_DELTAS

    def thinks(self, chunk: Chunk) -> bool:
        obj = chunk.obj
        if obj.get("type") != "response.output_item.added":
            return False
        item = obj.get("item")
        return type(item) is dict and item.get("type") == "reasoning"

    def new_accumulator(self) -> ResponsesAccumulator:
        return ResponsesAccumulator()

    def splicer(self, accumulator: RunAccumulator, body: dict[str, Any]) -> ResponsesSplicer:
        assert isinstance(accumulator, ResponsesAccumulator)
        model = body.get("model")
        return ResponsesSplicer(
            accumulator,
            model=model if isinstance(model, str) else None,
            background=body.get("background") is True,
        )

    def upstream_body(self, body: dict[str, Any], model: str) -> dict[str, Any]:
        return body | {"model": model, "stream": True}

    def in_background(self, body: dict[str, Any]) -> dict[str, Any] | None:
        if body.get("store") is False:  # a background response is a stored one
            return None
        return body if body.get("background") is True else body | {"background": True}

    def for_continuation(self, body: dict[str, Any]) -> dict[str, Any]:
        return for_continuation(body)

    def continuation(
        self, body: dict[str, Any], sent: RunAccumulator, how: Continuing
    ) -> ContinuationRequest | None:
        continued = super().continuation(body, sent, how)
        return None if continued is None else typed_continuation(body, continued)

    def assemble(self, accumulator: RunAccumulator) -> dict[str, Any]:
        assert isinstance(accumulator, ResponsesAccumulator)
        return accumulator.response_object(accumulator.status or "completed")

    def replay(self, events: list[bytes]) -> ResponsesAccumulator:
        return replay(events)

    def is_terminal(self, event: bytes) -> bool:
        return event.startswith(
            (
                b"event: response.completed\n",
                b"event: response.incomplete\n",
                b"event: response.failed\n",
            )
        )

    def succeeded(self, event: bytes) -> bool:
        return event.startswith((b"event: response.completed\n", b"event: response.incomplete\n"))

    def error_event(self, error: GatewayError, events: int) -> bytes:
        body = error.body()["error"]
        event = {
            "type": "error",
            "code": body.get("code"),
            "message": body["message"],
            "param": None,
            "sequence_number": events,
        }
        return frame("error", orjson.dumps(event))


RESPONSES = ResponsesAdapter()

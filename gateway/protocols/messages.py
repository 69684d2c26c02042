"""The Anthropic Messages adapter: ``POST /v1/messages`` (ARCHITECTURE.md section 2a).

Every client event is ``event: <type>`` + ``data: {"type": <type>, …}``. Whatever the
legs do, the splicer (``messages_splice``) keeps:

- one ``message_start`` (the first leg's ``id`` and ``model``);
- content block ``index`` 0, 1, 2… over all legs, every block that starts also stops;
  a continuation's text goes on in the client's open text block, its seam trimmed;
- ``tool_use`` blocks released whole, at their ``content_block_stop``;
- ``thinking`` blocks held until they stop, so with their signature: a thinking block
  the client sent back without one would be refused, and the agent's next turn with
  it. A block cut before its stop is never shown; the leg that replaces it thinks
  again. A later leg's thinking is not sent once the client has any block;
- one ``message_delta`` with the ``stop_reason`` and usage summed over legs, then one
  ``message_stop``; on failure ``event: error`` (Anthropic's shape), no ``message_stop``.

Upstream ``ping`` events are not relayed: the gateway pings a client itself whenever
its stream has been silent for a while (``state.keepalive_interval``), recovery waits
included. ``overloaded_error`` and ``api_error`` events are transient (recovered),
other errors are surfaced.

Continuation: ``prefill`` (the text so far as the final assistant message) where
the model takes it, else ``prompt`` mode; a request with extended thinking on is
always continued in ``prompt`` mode (Anthropic takes no prefill with thinking), its
assistant turn carrying the client's signed thinking blocks before the text.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.protocols.base import Adapter
from gateway.protocols.messages_items import THINKING, MessagesAccumulator
from gateway.protocols.messages_splice import MESSAGE_STOP, PING, MessagesSplicer, error_event
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.events import DONE, Chunk, Event, InBandError, Malformed, decode
from gateway.upstream.continuation import ContinuationRequest, Continuing, continuation_request

_DELTA_FIELDS = ("text", "thinking", "partial_json")


def parse_event(data: bytes) -> Event:
    event = decode(data)
    if type(event) is Malformed:
        return event
    assert type(event) is Chunk
    kind = event.obj.get("type")
    if kind == "message_stop":
        return DONE
    if kind == "error":
        error = event.obj.get("error")
        if type(error) is not dict:
            error = {"type": "api_error", "message": "upstream error"}
        return InBandError(error)
    return event


# The deltas of the answer itself: after these, no silent thinking is expected.
ANSWER_DELTAS = frozenset({"text_delta", "input_json_delta", "citations_delta"})


def delta_chars(chunk: Chunk) -> int:
    delta = chunk.obj.get("delta")
    if type(delta) is dict:
        for name in _DELTA_FIELDS:
            value = delta.get(name)
            if type(value) is str:
                return len(value)
    return 0


def thinking_on(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return type(thinking) is dict and thinking.get("type") in ("enabled", "adaptive")


def replay(events: list[bytes]) -> MessagesAccumulator:
    """What a client assembled from the events it was sent (a takeover's starting point)."""
    accumulator = MessagesAccumulator()
    splicer = MessagesSplicer(accumulator)
    for event in events:
        data = event.partition(b"\ndata: ")[2].rstrip(b"\n")
        obj = orjson.loads(data) if data else None
        if type(obj) is dict and obj.get("type") not in ("error", "message_stop"):
            # The client's own events, fed back: they are already in its numbering.
            splicer.feed(Chunk(data, obj))
    return accumulator


class MessagesAdapter(Adapter):
    name = "messages"
    path = "/messages"  # under an anthropic upstream's /v1 (config.Upstream.api_root)
    keepalive = PING
    budget_fields = ("max_tokens",)

    def structured(self, body: dict[str, Any]) -> bool:
        # Structured outputs: ``output_config.format`` (and the beta's ``output_format``).
        config = body.get("output_config")
        nested = config.get("format") if type(config) is dict else None
        formats = (body.get("output_format"), nested)
        return any(type(f) is dict and f.get("type") == "json_schema" for f in formats)

    def parse_event(self, data: bytes) -> Event:
        return parse_event(data)

    def delta_chars(self, chunk: Chunk) -> int:
        return delta_chars(chunk)

    def answers(self, chunk: Chunk) -> bool:
        delta = chunk.obj.get("delta")
        return type(delta) is dict and delta.get("type") in ANSWER_DELTAS

    def thinks(self, chunk: Chunk) -> bool:
        obj = chunk.obj
        if obj.get("type") != "content_block_start":
            return False
        block = obj.get("content_block")
        return type(block) is dict and block.get("type") in THINKING

    def new_accumulator(self) -> MessagesAccumulator:
        return MessagesAccumulator()

    def splicer(self, accumulator: RunAccumulator, body: dict[str, Any]) -> MessagesSplicer:
        assert isinstance(accumulator, MessagesAccumulator)
        return MessagesSplicer(accumulator)

    def upstream_body(self, body: dict[str, Any], model: str) -> dict[str, Any]:
        return body | {"model": model, "stream": True}

    def continuation(
        self, body: dict[str, Any], sent: RunAccumulator, how: Continuing
    ) -> ContinuationRequest | None:
        thinking = thinking_on(body)
        mode = how.mode
        if thinking and mode != "none":
            mode = "prompt"  # Anthropic takes no assistant prefill with thinking on
        continued = continuation_request(body, mode, sent.text, how.prompt, anchored=how.anchored)
        if continued is None or not thinking or not isinstance(sent, MessagesAccumulator):
            return continued
        # The assistant turn as the client has it: its signed thinking, then the text.
        signed = [block.final() for block in sent.blocks if block.type in THINKING]
        if not signed:
            return continued
        messages = list(continued.body["messages"])
        assistant = messages[-2]
        messages[-2] = assistant | {
            "content": [*signed, {"type": "text", "text": assistant["content"]}]
        }
        body = continued.body | {"messages": messages}
        return ContinuationRequest(body, continued.seam, prefill=continued.prefill)

    def assemble(self, accumulator: RunAccumulator) -> dict[str, Any]:
        assert isinstance(accumulator, MessagesAccumulator)
        return accumulator.message_object()

    def replay(self, events: list[bytes]) -> MessagesAccumulator:
        return replay(events)

    def is_terminal(self, event: bytes) -> bool:
        return event == MESSAGE_STOP or event.startswith(b"event: error\n")

    def succeeded(self, event: bytes) -> bool:
        return event == MESSAGE_STOP

    def error_event(self, error: GatewayError, events: int) -> bytes:
        return error_event(error)


MESSAGES = MessagesAdapter()

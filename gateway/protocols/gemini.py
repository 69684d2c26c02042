"""The Gemini adapter: ``POST /v1beta/models/{model}:streamGenerateContent`` (section 2b).

Every client event is ``data: {GenerateContentResponse}``, with nothing else on the
wire: no comments, no ``event:`` lines, no keepalives (the JS SDK inside Gemini CLI
reads only ``data: `` lines from the start of its buffer, and one that is not stalls
its stream). Whatever the legs do, the splicer (``gemini_splice``) keeps:

- one ``responseId`` and ``modelVersion`` (the first leg's) on every chunk;
- text never repeated or retracted, the seam trimmed as for the other protocols;
- thought parts (``thought: true``) already shown kept, a later leg's not shown once
  the client has any part;
- every ``functionCall`` part whole and once, its ``id`` unique in the answer;
- every ``thoughtSignature`` relayed unchanged on the part it came on;
- exactly one ``finishReason``, on the last chunk, with ``usageMetadata`` summed over
  legs (every field kept); every chunk with content parts;
- on failure, Google's error object ``{"error": {"code", "message", "status"}}``, raw
  and in a write of its own after a short pause (``error_pause``), which both the Python
  and the JS SDK raise on; never a clean end.

A stream that ends without ``finishReason`` is an interruption (the SDK would take it
as a short answer). An in-band error (a ``data:`` event, or Google's raw error object
after the events: ``upstream.providers.GeminiDecoder``) is transient when its code is
429 or 5xx (``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``, ``INTERNAL``), else surfaced.

Continuation: ``prefill``, the text so far as a trailing ``model`` turn, where the
model takes it; Gemini 3 refuses one with a 400, which the run learns per model and
continues in ``prompt`` mode. The model turn carries the parts the client has (its
thoughts and its text) with their signatures, but only to a leg of the provider kind
that made them: a signature is valid only where it was issued (Developer API or Vertex
AI), and text needs none.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config.schema import Continuation
from gateway.errors import GatewayError
from gateway.protocols.base import Adapter
from gateway.protocols.gemini_items import SIGNATURE, GeminiAccumulator
from gateway.protocols.gemini_splice import GeminiSplicer, error_object
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.events import Chunk, Event, InBandError, Malformed, decode
from gateway.upstream.continuation import ContinuationRequest, Continuing, continuation_request

_ERROR = b'{"error"'
_FINISH = b'"finishReason"'
_BLOCKED = b'"blockReason"'


def parse_event(data: bytes) -> Event:
    event = decode(data)
    if type(event) is Malformed:
        return event
    assert type(event) is Chunk
    error = event.obj.get("error")
    if error is not None:
        return InBandError(error if type(error) is dict else {"message": str(error)})
    return event


def _parts(chunk: Chunk) -> list[Any]:
    candidates = chunk.obj.get("candidates")
    if type(candidates) is not list or not candidates or type(candidates[0]) is not dict:
        return []
    content = candidates[0].get("content")
    parts = content.get("parts") if type(content) is dict else None
    return parts if type(parts) is list else []


def delta_chars(chunk: Chunk) -> int:
    chars = 0
    for part in _parts(chunk):
        if type(part) is dict:
            text = part.get("text")
            if type(text) is str:
                chars += len(text)
            elif "functionCall" in part:
                chars += len(orjson.dumps(part["functionCall"]))
    return chars


def replay(events: list[bytes]) -> GeminiAccumulator:
    """What a client assembled from the events it was sent (a takeover's starting point):
    who signed each part is not known from them, so no signature goes back upstream."""
    accumulator = GeminiAccumulator()
    splicer = GeminiSplicer(accumulator)
    for event in events:
        if not event.startswith(b"data: "):
            continue  # the error object that ended it
        obj = orjson.loads(event[6:])
        if type(obj) is dict:
            splicer.feed(Chunk(event[6:].rstrip(b"\n"), obj))
    return accumulator


def thinking_requested(body: dict[str, Any]) -> bool:
    config = body.get("generationConfig")
    return type(config) is dict and type(config.get("thinkingConfig")) is dict


class GeminiAdapter(Adapter):
    name = "gemini"
    # The method under the model, whose name the provider puts in the path
    # (``upstream.providers``): /models/{model}:streamGenerateContent?alt=sse.
    path = ":streamGenerateContent"
    turns = "contents"
    keepalive = b""  # nothing but data events: see the module docstring
    # The JS SDK raises on the error object only when one read holds it alone: written
    # after a pause, it arrives so wherever the client keeps up (else it still fails the
    # stream, as "Incomplete JSON segment", never a clean end).
    error_pause = 0.1

    def budget(self, body: dict[str, Any]) -> int | None:
        tokens = _generation_config(body).get("maxOutputTokens")
        return tokens if type(tokens) is int and tokens > 0 else None

    def with_budget(self, body: dict[str, Any], tokens: int) -> dict[str, Any]:
        config = _generation_config(body) | {"maxOutputTokens": tokens}
        return body | {"generationConfig": config}

    def greedy(self, body: dict[str, Any]) -> bool:
        return super().greedy(_generation_config(body))

    def structured(self, body: dict[str, Any]) -> bool:
        config = _generation_config(body)
        return (
            config.get("responseMimeType") == "application/json"
            or config.get("responseSchema") is not None
            or config.get("responseJsonSchema") is not None
        )

    def parse_event(self, data: bytes) -> Event:
        return parse_event(data)

    def delta_chars(self, chunk: Chunk) -> int:
        return delta_chars(chunk)

    def answers(self, chunk: Chunk) -> bool:
        return any(
            type(part) is dict
            and part.get("thought") is not True
            and ("text" in part or "functionCall" in part)
            for part in _parts(chunk)
        )

    def thinks(self, chunk: Chunk) -> bool:
        return any(type(part) is dict and part.get("thought") is True for part in _parts(chunk))

    def new_accumulator(self) -> GeminiAccumulator:
        return GeminiAccumulator()

    def splicer(self, accumulator: RunAccumulator, body: dict[str, Any]) -> GeminiSplicer:
        assert isinstance(accumulator, GeminiAccumulator)
        return GeminiSplicer(accumulator)

    def upstream_body(self, body: dict[str, Any], model: str) -> dict[str, Any]:
        # ``model`` and ``stream`` are the gateway's (the door put them there): the
        # provider takes them out, the model going into the path.
        return body | {"model": model, "stream": True}

    def continuation(
        self, body: dict[str, Any], sent: RunAccumulator, how: Continuing
    ) -> ContinuationRequest | None:
        assert isinstance(sent, GeminiAccumulator)
        mode: Continuation = how.mode if how.mode in ("prompt", "none") else "prefill"
        generic = continuation_request({}, mode, sent.text, how.prompt, anchored=how.anchored)
        if generic is None:
            return None
        assistant, *asked = generic.body["messages"]
        turns: list[dict[str, Any]] = [
            {"role": "model", "parts": model_parts(sent, assistant["content"])}
        ]
        turns += [{"role": "user", "parts": [{"text": turn["content"]}]} for turn in asked]
        contents = body.get("contents")
        contents = list(contents) if type(contents) is list else [contents] if contents else []
        continued = body | {"contents": contents + turns}
        return ContinuationRequest(continued, generic.seam, prefill=generic.prefill)

    def assemble(self, accumulator: RunAccumulator) -> dict[str, Any]:
        assert isinstance(accumulator, GeminiAccumulator)
        return accumulator.response_object()

    def replay(self, events: list[bytes]) -> GeminiAccumulator:
        return replay(events)

    def is_terminal(self, event: bytes) -> bool:
        return event.startswith(_ERROR) or self.succeeded(event)

    def succeeded(self, event: bytes) -> bool:
        return event.startswith(b"data: ") and (_FINISH in event or _BLOCKED in event)

    def error_event(self, error: GatewayError, events: int) -> bytes:
        return error_object(error)


def model_parts(sent: GeminiAccumulator, text: str) -> list[dict[str, Any]]:
    """The model turn of a continuation: the client's thought and text parts as it has
    them, its text cut to ``text`` (the answer so far as the continuation mode sends it:
    a prefill without its trailing whitespace). A signature goes only to the provider
    kind that issued it (``sent.origin``: the leg being asked), and only on a part whose
    text is still what it signed."""
    parts: list[dict[str, Any]] = []
    for part, origin in zip(sent.parts, sent.origins, strict=True):
        if type(part.get("text")) is not str and part.get("thought") is not True:
            continue  # a call (none in a continued answer) or another kind of part
        if SIGNATURE in part and (origin is None or origin != sent.origin):
            part = {k: v for k, v in part.items() if k != SIGNATURE}
        parts.append(part)
    # The answer's text parts, cut from the end to ``text``'s length.
    excess = sum(len(p.get("text", "")) for p in parts if p.get("thought") is not True)
    excess -= len(text)
    for index in range(len(parts) - 1, -1, -1):
        if excess <= 0:
            break
        part = parts[index]
        if part.get("thought") is True:
            continue
        kept = part["text"][: max(0, len(part["text"]) - excess)]
        excess -= len(part["text"]) - len(kept)
        unsigned = {k: v for k, v in part.items() if k != SIGNATURE}
        parts[index] = unsigned | {"text": kept}
    return [p for p in parts if p.get("text") or SIGNATURE in p]


GEMINI = GeminiAdapter()


def _generation_config(body: dict[str, Any]) -> dict[str, Any]:
    config = body.get("generationConfig")
    return config if type(config) is dict else {}

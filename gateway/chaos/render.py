"""What the chaos upstream says, as bytes: SSE framing, chunk envelopes, JSON documents.

The per-chunk path is ``EventFormat.event(Envelope.chunk(body))``: concatenations
of pre-encoded bytes. Whole documents (non-streaming answers, errors, usage) are
encoded with orjson once per response.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.chaos.answer import Script

DONE = b"[DONE]"
MALFORMED = b'{"choices": ['  # a data line that is not JSON, as a buggy upstream sends


class EventFormat:
    """How one response frames SSE events: its line ending, and optional comments."""

    def __init__(self, line_ending: bytes, comments: bool) -> None:
        end = line_ending
        self._line = end
        self._end = end + end
        if comments:
            # Both forms a decoder must skip: a comment-only event (a ping), and a
            # comment line inside an event; plus the default ``event: message`` field.
            self._prefixes = (
                b": keepalive" + end + end + b"event: message" + end + b"data: ",
                b": keepalive" + end + b"event: message" + end + b"data: ",
            )
            self._comments = (b": keepalive" + end + end, b": keepalive" + end)
        else:
            self._prefixes = (b"data: ", b"data: ")
            self._comments = (b"", b"")

    def event(self, data: bytes, index: int = 0) -> bytes:
        return self._prefixes[index & 1] + data + self._end

    @property
    def end(self) -> bytes:
        """What ends every event."""
        return self._end

    def named_head(self, name: bytes, index: int = 0) -> bytes:
        """What precedes the data of a named event: comments, ``event: name``, ``data: ``."""
        return self._comments[index & 1] + b"event: " + name + self._line + b"data: "

    def named(self, name: bytes, data: bytes, index: int = 0) -> bytes:
        """An event with an ``event:`` field, as the Responses API names every event."""
        return self.named_head(name, index) + data + self._end


@dataclass(frozen=True)
class Envelope:
    """The bytes around every chunk body of one response: its id, created and model."""

    head: bytes
    tail: bytes

    def chunk(self, body: bytes) -> bytes:
        return self.head + body + self.tail


def _meta(response_id: str, obj: str, created: int, model: str) -> bytes:
    return (
        b'{"id":'
        + orjson.dumps(response_id)
        + b',"object":"'
        + obj.encode()
        + b'","created":'
        + str(created).encode()
        + b',"model":'
        + orjson.dumps(model)
    )


def chat_envelope(response_id: str, created: int, model: str) -> Envelope:
    head = _meta(response_id, "chat.completion.chunk", created, model)
    head += b',"system_fingerprint":"fp_chaos","choices":[{"index":0,"delta":'
    return Envelope(head, b',"logprobs":null}]}')


def legacy_envelope(response_id: str, created: int, model: str) -> Envelope:
    head = _meta(response_id, "text_completion", created, model) + b',"choices":[{"index":0,'
    return Envelope(head, b',"logprobs":null}]}')


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def usage_chunk(
    response_id: str, obj: str, created: int, model: str, counts: dict[str, int]
) -> bytes:
    """The trailing chunk of ``stream_options.include_usage``: no choices, only usage."""
    return orjson.dumps(
        {
            "id": response_id,
            "object": obj,
            "created": created,
            "model": model,
            "system_fingerprint": "fp_chaos",
            "choices": [],
            "usage": counts,
        }
    )


def chat_completion(
    response_id: str,
    created: int,
    model: str,
    script: Script,
    content: str,
    counts: dict[str, int],
) -> bytes:
    message: dict[str, Any] = {
        "role": "assistant",
        # OpenAI sends null, not "", when the answer is only tool calls.
        "content": content if content or not script.tool_calls else None,
    }
    if script.reasoning_deltas:
        message["reasoning_content"] = "".join(script.reasoning_deltas)
    if script.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in script.tool_calls
        ]
    choice = {"index": 0, "message": message, "finish_reason": script.finish_reason}
    return orjson.dumps(
        {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_chaos",
            "choices": [{**choice, "logprobs": None}],
            "usage": counts,
        }
    )


def text_completion(
    response_id: str, created: int, model: str, text: str, counts: dict[str, int]
) -> bytes:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}
    return orjson.dumps(
        {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": counts,
        }
    )


def error_body(message: str, kind: str, code: str | int | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


# In-band error events, shaped as the spec asks (no "param", like vLLM's).
IN_BAND_ERRORS = {
    "error": orjson.dumps(
        {"error": {"message": "upstream overloaded", "type": "server_error", "code": 503}}
    ),
    "error_fatal": orjson.dumps(
        {
            "error": {
                "message": "The response was filtered due to the content management policy.",
                "type": "invalid_request_error",
                "code": "content_policy_violation",
            }
        }
    ),
}

# http_* faults: the error body each status carries at OpenAI (or, for 529, Anthropic).
HTTP_ERRORS: dict[str, tuple[str, str, str | None]] = {
    "http_400": ("Invalid request (chaos).", "invalid_request_error", None),
    "http_400_context": (
        "This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in 9000 tokens. Please reduce the length of the messages.",
        "invalid_request_error",
        "context_length_exceeded",
    ),
    "http_401": ("Incorrect API key provided (chaos).", "invalid_request_error", "invalid_api_key"),
    "http_404": ("The model does not exist (chaos).", "invalid_request_error", "model_not_found"),
    "http_429": ("Rate limit reached (chaos).", "requests", "rate_limit_exceeded"),
    "http_429_retry": ("Rate limit reached (chaos).", "requests", "rate_limit_exceeded"),
    "http_500": ("The server had an error processing your request (chaos).", "server_error", None),
    "http_502": ("Bad gateway (chaos).", "server_error", None),
    "http_503": ("The engine is currently overloaded (chaos).", "server_error", None),
    "http_529": ("Overloaded (chaos).", "overloaded_error", None),
}

MODELS = orjson.dumps(
    {
        "object": "list",
        "data": [{"id": "chaos", "object": "model", "created": 0, "owned_by": "chaos"}],
    }
)


def embedding(text: str) -> list[float]:
    """Eight floats in [-1, 1], a function of the text alone."""
    digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
    return [round(value / 32767.5 - 1.0, 6) for value in struct.unpack("<8H", digest)]


def embeddings(model: str, inputs: Sequence[str], base64_floats: bool) -> bytes:
    data: list[dict[str, Any]] = []
    for index, text in enumerate(inputs):
        vector: list[float] | str = embedding(text)
        if base64_floats:  # what the openai SDK asks for by default: little-endian float32
            vector = base64.b64encode(struct.pack("<8f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    tokens = sum(max(1, len(text.split())) for text in inputs)
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )

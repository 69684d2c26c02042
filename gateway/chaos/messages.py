"""The Anthropic Messages dialect of the chaos upstream (``POST /v1/messages``).

The answer is the chat answer (``answer.py``): its reasoning as a ``thinking``
block (with a signature, ``thinking_signature``), its text as a ``text`` block,
its tool calls as ``tool_use`` blocks, resumed the same way after an assistant
prefix. Every event is ``event: <type>`` plus ``data: {"type": <type>, ...}``::

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)* per block,
    message_delta (stop_reason, output_tokens), message_stop

Block indices count from 0: the thinking block (if the answer reasons), the text
block (if this response says some text), then one block per tool call. A
``tool_use`` block's first delta is an empty ``input_json_delta``, as Anthropic
sends it; the thinking block ends with a ``signature_delta``. What ``at=`` counts
are the content deltas: ``thinking_delta``, ``text_delta`` and the non-empty
``input_json_delta`` ones.

A continuation is either prompt mode (an assistant message, then a user message
asking to continue: ``asked.assistant_prefix``) or Anthropic's prefill: a last
message from the assistant, with no flag (``messages_prefix``). A prefill that
ends in whitespace is refused with a 400, as Anthropic refuses it
(``prefill_error``). Errors, in the body of an error status or as an in-band
``error`` event, have Anthropic's shape (``error_body``).

The delta part of every delta event (``,"delta":{...}}``) is encoded once per
answer (``messages_script`` is cached); a response adds its block indexes, and
encodes its few whole documents (block starts, the Message object) once.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from gateway.chaos.answer import Script, ScriptKey, encoded, resume_at, script_for, script_key
from gateway.chaos.asked import assistant_prefix, message_text
from gateway.chaos.render import EventFormat
from gateway.chaos.spec import ChaosSpec
from gateway.errors import ANTHROPIC_TYPES

MESSAGE_START = b"message_start"
PING = b"ping"
BLOCK_START = b"content_block_start"
BLOCK_DELTA = b"content_block_delta"
BLOCK_STOP = b"content_block_stop"
MESSAGE_DELTA = b"message_delta"
MESSAGE_STOP = b"message_stop"
ERROR = b"error"

_KINDS = (
    MESSAGE_START,
    PING,
    BLOCK_START,
    BLOCK_DELTA,
    BLOCK_STOP,
    MESSAGE_DELTA,
    MESSAGE_STOP,
    ERROR,
)

# One Messages event: its type (the ``event:`` field) and its data, the JSON it
# carries (or, for the malformed fault, something that is not JSON). A plain tuple:
# a plan makes one per delta.
Event = tuple[bytes, bytes]

PING_EVENT: Event = (PING, b'{"type": "ping"}')  # with the space, as Anthropic sends it
MESSAGE_STOP_EVENT: Event = (MESSAGE_STOP, b'{"type":"message_stop"}')
# A data line that is not JSON, as a buggy upstream sends: a delta cut short.
MALFORMED = b'{"type":"content_block_delta",'
MALFORMED_EVENT: Event = (BLOCK_DELTA, MALFORMED)

_EMPTY_JSON_TAIL = b',"delta":{"type":"input_json_delta","partial_json":""}}'

TRAILING_WHITESPACE = "final assistant content cannot end with trailing whitespace"

# fault -> the ``error`` event's (type, message). ``error`` is transient (Anthropic's
# overloaded stream error), ``error_fatal`` is not; ``error_done`` and
# ``finish_error`` are server errors, ``error_done``'s followed by ``message_stop``.
IN_BAND_ERRORS: dict[str, tuple[str, str]] = {
    "error": ("overloaded_error", "Overloaded"),
    "error_fatal": ("invalid_request_error", "Output blocked by content filtering policy"),
    "error_done": ("api_error", "Internal server error"),
    "finish_error": ("api_error", "Internal server error"),
}

# http_* faults: the (type, message) of the error body each status carries at Anthropic.
HTTP_ERRORS: dict[str, tuple[str, str]] = {
    "http_400": ("invalid_request_error", "Invalid request (chaos)."),
    "http_400_context": ("invalid_request_error", "prompt is too long: 9000 tokens > 8192 maximum"),
    "http_401": ("authentication_error", "invalid x-api-key (chaos)"),
    "http_404": ("not_found_error", "model: not found (chaos)"),
    "http_429": ("rate_limit_error", "Number of requests has exceeded your rate limit (chaos)."),
    "http_429_retry": (
        "rate_limit_error",
        "Number of requests has exceeded your rate limit (chaos).",
    ),
    "http_500": ("api_error", "Internal server error (chaos)"),
    "http_502": ("api_error", "Bad gateway (chaos)"),
    "http_503": ("api_error", "Service unavailable (chaos)"),
    "http_529": ("overloaded_error", "Overloaded (chaos)"),
}


def status_error_type(status: int) -> str:
    """The Anthropic error type of an error status (``api_error`` for other 5xx)."""
    return ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(kind: str, message: str) -> bytes:
    """An Anthropic error document: ``{"type":"error","error":{"type":..,"message":..}}``."""
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def fault_events(fault: str) -> list[Event]:
    """The events an in-band error fault sends in place of the rest of the stream."""
    kind, message = IN_BAND_ERRORS[fault]
    sent: list[Event] = [(ERROR, error_body(kind, message))]
    if fault == "error_done":  # a server that still says stop after an error
        sent.append(MESSAGE_STOP_EVENT)
    return sent


# --- continuations ---------------------------------------------------------------------


def prefill_of(body: dict[str, Any]) -> str | None:
    """The text of the trailing assistant message (Anthropic's prefill), or None when the
    conversation does not end with one. Blocks without text (thinking) are ignored."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    return message_text(last)


def messages_prefix(body: dict[str, Any]) -> str:
    """The assistant text a Messages request asks to continue ("" for a fresh one): a
    prefill (a trailing assistant message needs no flag here), else prompt mode."""
    prefill = prefill_of(body)
    return assistant_prefix(body) if prefill is None else prefill


def prefill_error(body: dict[str, Any]) -> str | None:
    """Why Anthropic would refuse this request's prefill (trailing whitespace), or None."""
    prefill = prefill_of(body)
    if prefill is not None and prefill != prefill.rstrip():
        return TRAILING_WHITESPACE
    return None


def thinking_signature(number: int, reasoning: str) -> str:
    """The signature of the thinking block of the ``number``-th response (its id is
    ``msg_chaos_<number>``) saying ``reasoning``: deterministic, new per response."""
    return f"sig_{number}_{hashlib.sha256(reasoning.encode()).hexdigest()[:16]}"


def refused_thinking(body: dict[str, Any]) -> str | None:
    """Why Anthropic would refuse the thinking blocks sent back in ``messages``, or None:
    a ``thinking`` block must carry the signature its response gave for its text (a
    block cut short, or without its signature, cannot be verified)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for at, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or message.get("role") != "assistant":
            continue
        for index, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "thinking":
                continue
            signature, thinking = block.get("signature"), block.get("thinking")
            parts = signature.split("_") if isinstance(signature, str) else []
            number = parts[1] if len(parts) > 2 else ""
            if (
                not number.isdigit()
                or not isinstance(thinking, str)
                or signature != (thinking_signature(int(number), thinking))
            ):
                return f"messages.{at}.content.{index}: Invalid `signature` in `thinking` block"
    return None


def message_id(number: int) -> str:
    return f"msg_chaos_{number}"


# --- the events of one response ----------------------------------------------------------


class MessagesPlan(NamedTuple):
    """The events of one response, ``message_start`` to ``message_stop``, whether each
    carries content (what a fault's ``at=`` counts), and the whole Message (the
    non-streaming answer)."""

    events: list[Event]
    counts: list[bool]
    message: dict[str, Any]


@dataclass(frozen=True)
class MessagesScript:
    """One answer's delta events, their ``"delta"`` members pre-encoded (without index)."""

    script: Script
    reasoning: str
    thinking_tails: tuple[bytes, ...]
    text_tails: tuple[bytes, ...]
    fragment_tails: tuple[tuple[bytes, ...], ...]  # per tool call
    inputs: tuple[Any, ...]  # per tool call: its arguments, parsed


def _thinking_tail(delta: str) -> bytes:
    return b',"delta":{"type":"thinking_delta","thinking":' + orjson.dumps(delta) + b"}}"


def _text_tail(delta: str) -> bytes:
    return b',"delta":{"type":"text_delta","text":' + orjson.dumps(delta) + b"}}"


def _json_tail(fragment: str) -> bytes:
    return b',"delta":{"type":"input_json_delta","partial_json":' + orjson.dumps(fragment) + b"}}"


@functools.lru_cache(maxsize=256)
def _messages_script(key: ScriptKey) -> MessagesScript:
    script = script_for(key)
    tails = encoded(script, reasoning=_thinking_tail, text=_text_tail, fragment=_json_tail)
    inputs = tuple(orjson.loads(call.arguments) for call in script.tool_calls)
    return MessagesScript(script, "".join(script.reasoning_deltas), *tails, inputs)


def messages_script(spec: ChaosSpec) -> MessagesScript:
    """The answer of ``spec`` (``script_for``) with its Messages delta events pre-encoded."""
    return _messages_script(script_key(spec))


def message_object(
    number: int,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    """A Message, as ``message_start`` carries it (empty) or a non-streaming answer (whole)."""
    return {
        "id": message_id(number),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def messages_plan(
    answer: MessagesScript,
    prefix: str = "",
    echo: str = "",
    deltas: Sequence[str] | None = None,
    *,
    number: int = 1,
    model: str = "chaos",
    input_tokens: int = 11,
) -> MessagesPlan:
    """The events of a Messages stream resuming after ``prefix`` of the answer text.

    As ``chat_plan``: the thinking block comes again on a continuation (with this
    response's signature), the text resumes mid-delta if the prefix ended there
    (after ``echo``), tool calls come whole. The text block is there only if this
    response says some text. ``deltas`` (``attempt_deltas``), when given, are the
    text after the prefix.
    """
    script = answer.script
    opened = message_object(
        number, model, [], None, {"input_tokens": input_tokens, "output_tokens": 1}
    )
    start = {"type": "message_start", "message": opened}
    events: list[Event] = [(MESSAGE_START, orjson.dumps(start)), PING_EVENT]
    counts = [False, False]
    content: list[dict[str, Any]] = []

    def add(kind: bytes, data: bytes) -> None:
        events.append((kind, data))
        counts.append(False)

    def open_block(opened: dict[str, Any], whole: dict[str, Any]) -> bytes:
        """Start a block; return the head of its delta events (up to their ``delta``)."""
        index = len(content)
        started = {"type": "content_block_start", "index": index, "content_block": opened}
        add(BLOCK_START, orjson.dumps(started))
        content.append(whole)
        return b'{"type":"content_block_delta","index":%d' % index

    def add_deltas(where: bytes, tails: Sequence[bytes]) -> None:
        events.extend([(BLOCK_DELTA, where + tail) for tail in tails])
        counts.extend([True] * len(tails))

    def close_block() -> None:
        add(BLOCK_STOP, b'{"type":"content_block_stop","index":%d}' % (len(content) - 1))

    if answer.thinking_tails:
        signature = thinking_signature(number, answer.reasoning)
        where = open_block(
            {"type": "thinking", "thinking": "", "signature": ""},
            {"type": "thinking", "thinking": answer.reasoning, "signature": signature},
        )
        add_deltas(where, answer.thinking_tails)
        signed = {"type": "signature_delta", "signature": signature}
        add(BLOCK_DELTA, where + b',"delta":' + orjson.dumps(signed) + b"}")
        close_block()

    if deltas is None:
        remainder, resume = resume_at(script, prefix)
        tails = [_text_tail(piece) for piece in (echo, remainder) if piece]
        tails += answer.text_tails[resume:]
        said = script.text[len(prefix) :]
    else:
        tails = [_text_tail(piece) for piece in (echo, *deltas) if piece]
        said = "".join(deltas)
    if tails:
        where = open_block({"type": "text", "text": ""}, {"type": "text", "text": echo + said})
        add_deltas(where, tails)
        close_block()

    for call, fragment_tails, arguments in zip(
        script.tool_calls, answer.fragment_tails, answer.inputs, strict=True
    ):
        block = {"type": "tool_use", "id": call.id, "name": call.name}
        where = open_block(block | {"input": {}}, block | {"input": arguments})
        add(BLOCK_DELTA, where + _EMPTY_JSON_TAIL)
        add_deltas(where, fragment_tails)
        close_block()

    stop_reason = "tool_use" if script.tool_calls else "end_turn"
    output_tokens = sum(counts)
    finished = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }
    add(MESSAGE_DELTA, orjson.dumps(finished))
    events.append(MESSAGE_STOP_EVENT)
    counts.append(False)
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    message = message_object(number, model, content, stop_reason, usage)
    return MessagesPlan(events, counts, message)


def encode_events(events: list[Event], events_format: EventFormat) -> list[bytes]:
    """The SSE bytes of ``events``: ``event: <type>``, then ``data: <json>``."""
    # Per kind, everything before the data, for even and odd events (comments alternate).
    heads = [{kind: events_format.named_head(kind, parity) for kind in _KINDS} for parity in (0, 1)]
    end = events_format.end
    return [heads[index & 1][kind] + data + end for index, (kind, data) in enumerate(events)]

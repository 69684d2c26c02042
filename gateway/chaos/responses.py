"""The OpenAI Responses dialect of the chaos upstream (``POST /v1/responses``).

The answer is the chat answer (``answer.py``): the same text, reasoning (as a
reasoning item's summary) and tool calls (as ``function_call`` items), resumed
the same way after an assistant prefix. Only its events differ: every one is
``event: <type>`` plus ``data: {"type": <type>, "sequence_number": n, ...}``.

The sequence numbers are only known once a fault has decided what is sent, so an
event is kept as its type and the JSON *after* its number (``Event``); the
numbers go in as the stream is encoded (``encode_events``), as concatenations.
The delta part of every delta event (``"delta":...``) is encoded once per answer
(``responses_script`` is cached); a response adds its item ids and output indexes,
and encodes its few whole documents (items, the Response object) once.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from gateway.chaos.answer import Script, ScriptKey, encoded, resume_at, script_for, script_key
from gateway.chaos.render import EventFormat
from gateway.chaos.spec import ChaosSpec

CREATED = b"response.created"
QUEUED = b"response.queued"  # background mode only (background.py)
IN_PROGRESS = b"response.in_progress"
COMPLETED = b"response.completed"
FAILED = b"response.failed"
ERROR = b"error"
ITEM_ADDED = b"response.output_item.added"
ITEM_DONE = b"response.output_item.done"
SUMMARY_PART_ADDED = b"response.reasoning_summary_part.added"
SUMMARY_DELTA = b"response.reasoning_summary_text.delta"
SUMMARY_DONE = b"response.reasoning_summary_text.done"
SUMMARY_PART_DONE = b"response.reasoning_summary_part.done"
CONTENT_PART_ADDED = b"response.content_part.added"
TEXT_DELTA = b"response.output_text.delta"
TEXT_DONE = b"response.output_text.done"
CONTENT_PART_DONE = b"response.content_part.done"
ARGUMENTS_DELTA = b"response.function_call_arguments.delta"
ARGUMENTS_DONE = b"response.function_call_arguments.done"

_KINDS = (
    CREATED,
    QUEUED,
    IN_PROGRESS,
    COMPLETED,
    FAILED,
    ERROR,
    ITEM_ADDED,
    ITEM_DONE,
    SUMMARY_PART_ADDED,
    SUMMARY_DELTA,
    SUMMARY_DONE,
    SUMMARY_PART_DONE,
    CONTENT_PART_ADDED,
    TEXT_DELTA,
    TEXT_DONE,
    CONTENT_PART_DONE,
    ARGUMENTS_DELTA,
    ARGUMENTS_DONE,
)
# The JSON of every event starts with its type and its sequence number.
_HEADS = {kind: b'{"type":"' + kind + b'","sequence_number":' for kind in _KINDS}

SERVER_ERROR = "The server had an error processing your request."
# fault -> the terminal event it sends in place of the rest of the stream. ``error``
# and ``error_fatal`` are ``error`` events (code, message, param), the others
# ``response.failed`` whose ``response.error`` is (code, message). The codes are
# judged as gateway/recovery/classify.py's ``is_transient_error`` would: transient
# but for ``error_fatal``; ``finish_error`` carries the code chat's
# ``finish_reason: "error"`` stands for (500).
IN_BAND_ERRORS: dict[str, tuple[bytes, str, str]] = {
    "error": (ERROR, "server_error", SERVER_ERROR),
    "error_fatal": (
        ERROR,
        "invalid_prompt",
        "The response was filtered due to the content management policy.",
    ),
    "error_done": (FAILED, "server_error", SERVER_ERROR),
    "finish_error": (FAILED, "500", "The model stopped generating with an error."),
}


# One Responses event before numbering: ``(kind, rest)``, its type and its JSON after
# the number (``b',"item_id":...}'``); a ``rest`` of None is a malformed (non-JSON)
# payload. A plain tuple: a plan makes one per delta.
Event = tuple[bytes, bytes | None]

# A data line that is not JSON, as a buggy upstream sends; it takes no sequence number.
MALFORMED = b'{"type":"response.output_text.delta","sequence_number":'
MALFORMED_EVENT: Event = (TEXT_DELTA, None)

_EMPTY_SUMMARY_PART = b',"part":{"type":"summary_text","text":""}}'
_EMPTY_TEXT_PART = b',"part":{"type":"output_text","text":"","annotations":[]}}'


class ResponsesPlan(NamedTuple):
    """The events of one response, ``response.created`` to ``response.completed``, whether
    each carries content (what a fault's ``at=`` counts), and the completed Response
    object (the non-streaming answer)."""

    events: list[Event]
    counts: list[bool]
    response: dict[str, Any]


@dataclass(frozen=True)
class ResponsesScript:
    """One answer's delta events, their ``"delta"`` members pre-encoded (without ids)."""

    script: Script
    reasoning: str
    reasoning_tails: tuple[bytes, ...]
    text_tails: tuple[bytes, ...]
    fragment_tails: tuple[tuple[bytes, ...], ...]  # per tool call


def _text_tail(delta: str) -> bytes:
    return b',"delta":' + orjson.dumps(delta) + b',"logprobs":[]}'


def _delta_tail(delta: str) -> bytes:
    return b',"delta":' + orjson.dumps(delta) + b"}"


@functools.lru_cache(maxsize=256)
def _responses_script(key: ScriptKey) -> ResponsesScript:
    script = script_for(key)
    tails = encoded(script, reasoning=_delta_tail, text=_text_tail, fragment=_delta_tail)
    return ResponsesScript(script, "".join(script.reasoning_deltas), *tails)


def responses_script(spec: ChaosSpec) -> ResponsesScript:
    """The answer of ``spec`` (``script_for``) with its Responses delta events pre-encoded."""
    return _responses_script(script_key(spec))


def _rest(fields: dict[str, Any]) -> bytes:
    """``fields`` as the members that follow the sequence number."""
    return b"," + orjson.dumps(fields)[1:]


def response_object(
    response_id: str,
    created: int,
    model: str,
    status: str = "in_progress",
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Response object, small but whole enough for the openai SDK's ``Response`` model."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": error,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "output": [] if output is None else output,
        "parallel_tool_calls": True,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "usage": usage,
    }


def responses_usage(input_tokens: int, output_tokens: int, extra: int = 0) -> dict[str, Any]:
    """Usage as OpenAI reports it now (``cache_write_tokens`` included); ``extra``:
    counters nobody knows yet besides, nested and at the top (``usage_extra=N``)."""
    usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
    if extra:
        usage["input_tokens_details"]["future_tokens"] = extra
        usage["future_usage"] = {"units": extra}
    return usage


def response_id(number: int) -> str:
    return f"resp_chaos_{number}"


ENCRYPTED_CONTENT = "reasoning.encrypted_content"


def encrypted_content(summary: str) -> str:
    """The ``encrypted_content`` of a reasoning item whose summary says ``summary``: what
    a ``store: false`` client must send back for the item to be read again."""
    return "enc_" + hashlib.sha256(summary.encode()).hexdigest()[:24]


def asks_encrypted(body: dict[str, Any]) -> bool:
    include = body.get("include")
    return isinstance(include, list) and ENCRYPTED_CONTENT in include


def refused_items(body: dict[str, Any]) -> str | None:
    """Why OpenAI would refuse this request's ``input`` items, or None.

    As OpenAI does with ``store: false``: nothing is persisted, so a reasoning item
    sent back is read from its ``encrypted_content`` alone, which must be the one its
    response gave for its summary; and a ``function_call_output`` must answer a
    ``function_call`` of the same input.
    """
    items = body.get("input")
    if body.get("store") is not False or not isinstance(items, list):
        return None
    calls = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "reasoning":
            summary = item.get("summary")
            parts = summary if isinstance(summary, list) else []
            text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
            if item.get("encrypted_content") != encrypted_content(text):
                return (
                    f"Item with id '{item.get('id')}' not found. Items are not persisted "
                    "when `store` is set to false. Try again with `store` set to true, "
                    "or remove this item from your input."
                )
        elif kind == "function_call":
            calls.add(item.get("call_id"))
        elif kind == "function_call_output" and item.get("call_id") not in calls:
            call_id = item.get("call_id")
            return f"No tool call found for function call output with call_id {call_id}."
    return None


def responses_plan(
    answer: ResponsesScript,
    prefix: str = "",
    echo: str = "",
    deltas: Sequence[str] | None = None,
    *,
    number: int = 1,
    model: str = "chaos",
    created: int = 0,
    input_tokens: int = 11,
    encrypted: bool = False,
    usage_extra: int = 0,
) -> ResponsesPlan:
    """The events of a Responses stream resuming after ``prefix`` of the answer text.

    As ``chat_plan``: reasoning comes again on a continuation, the text resumes
    mid-delta if the prefix ended there (after ``echo``), tool calls come whole. The
    message item is there only if this response says some text. Item ids carry
    ``number`` (``rs_<n>``, ``msg_<n>``, ``fc_<n>_<j>``): they differ between responses.
    ``deltas`` (``attempt_deltas``), when given, are the text after the prefix.
    ``encrypted``: the request's ``include`` asked for the reasoning's
    ``encrypted_content``, which its done item and the Response then carry.
    """
    script = answer.script
    identity = response_id(number)
    opened = _rest({"response": response_object(identity, created, model)})
    events: list[Event] = [(CREATED, opened), (IN_PROGRESS, opened)]
    counts = [False, False]
    output: list[dict[str, Any]] = []

    def add(kind: bytes, rest: bytes) -> None:
        events.append((kind, rest))
        counts.append(False)

    def add_deltas(kind: bytes, where: bytes, tails: Sequence[bytes]) -> None:
        events.extend([(kind, where + tail) for tail in tails])
        counts.extend([True] * len(tails))

    def open_item(added: dict[str, Any], done: dict[str, Any]) -> None:
        add(ITEM_ADDED, _rest({"output_index": len(output), "item": added}))
        output.append(done)

    def item_done() -> None:
        add(ITEM_DONE, _rest({"output_index": len(output) - 1, "item": output[-1]}))

    if answer.reasoning_tails:
        item_id = f"rs_{number}".encode()
        where = b',"item_id":"%s","output_index":%d,"summary_index":0' % (item_id, len(output))
        part: dict[str, Any] = {"type": "summary_text", "text": answer.reasoning}
        item = {"id": item_id.decode(), "type": "reasoning"}
        done = item | {"summary": [part]}
        if encrypted:
            done["encrypted_content"] = encrypted_content(answer.reasoning)
        open_item(item | {"summary": []}, done)
        add(SUMMARY_PART_ADDED, where + _EMPTY_SUMMARY_PART)
        add_deltas(SUMMARY_DELTA, where, answer.reasoning_tails)
        add(SUMMARY_DONE, where + b',"text":' + orjson.dumps(answer.reasoning) + b"}")
        add(SUMMARY_PART_DONE, where + b',"part":' + orjson.dumps(part) + b"}")
        item_done()

    if deltas is None:
        remainder, start = resume_at(script, prefix)
        tails = [_text_tail(piece) for piece in (echo, remainder) if piece]
        tails += answer.text_tails[start:]
        said = script.text[len(prefix) :]
    else:
        tails = [_text_tail(piece) for piece in (echo, *deltas) if piece]
        said = "".join(deltas)
    if tails:
        text = echo + said
        item_id = f"msg_{number}".encode()
        where = b',"item_id":"%s","output_index":%d,"content_index":0' % (item_id, len(output))
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": item_id.decode(), "type": "message", "role": "assistant"}
        open_item(
            item | {"status": "in_progress", "content": []},
            item | {"status": "completed", "content": [part]},
        )
        add(CONTENT_PART_ADDED, where + _EMPTY_TEXT_PART)
        add_deltas(TEXT_DELTA, where, tails)
        add(TEXT_DONE, where + b',"text":' + orjson.dumps(text) + b',"logprobs":[]}')
        add(CONTENT_PART_DONE, where + b',"part":' + orjson.dumps(part) + b"}")
        item_done()

    for call_index, (call, fragment_tails) in enumerate(
        zip(script.tool_calls, answer.fragment_tails, strict=True)
    ):
        item_id = f"fc_{number}_{call_index}".encode()
        where = b',"item_id":"%s","output_index":%d' % (item_id, len(output))
        item = {
            "id": item_id.decode(),
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
        }
        open_item(
            item | {"status": "in_progress", "arguments": ""},
            item | {"status": "completed", "arguments": call.arguments},
        )
        add_deltas(ARGUMENTS_DELTA, where, fragment_tails)
        add(ARGUMENTS_DONE, where + _rest({"name": call.name, "arguments": call.arguments}))
        item_done()

    usage = responses_usage(input_tokens, sum(counts), usage_extra)
    response = response_object(identity, created, model, "completed", output, usage)
    add(COMPLETED, _rest({"response": response}))
    return ResponsesPlan(events, counts, response)


def fault_event(fault: str, number: int, created: int, model: str) -> Event:
    """The in-band error event a fault sends (``IN_BAND_ERRORS``)."""
    kind, code, message = IN_BAND_ERRORS[fault]
    if kind == ERROR:
        return ERROR, _rest({"code": code, "message": message, "param": None})
    error = {"code": code, "message": message}
    failed = response_object(response_id(number), created, model, "failed", error=error)
    return FAILED, _rest({"response": failed})


def encode_events(events: list[Event], events_format: EventFormat) -> list[bytes]:
    """The SSE bytes of ``events``, numbered 0, 1, 2, … (a malformed payload takes no number)."""
    # Per kind, everything before the number, for even and odd events (comments alternate).
    heads = [
        {kind: events_format.named_head(kind, parity) + _HEADS[kind] for kind in _KINDS}
        for parity in (0, 1)
    ]
    end = events_format.end
    encoded: list[bytes] = []
    number = 0
    for index, (kind, rest) in enumerate(events):
        if rest is None:
            encoded.append(events_format.named(kind, MALFORMED, index))
            continue
        encoded.append(heads[index & 1][kind] + b"%d" % number + rest + end)
        number += 1
    return encoded

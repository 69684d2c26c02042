"""The Gemini dialect's answer: a ``streamGenerateContent?alt=sse`` stream, or the whole
``generateContent`` response, and what each fault does to it.

Every event is ``data: <GenerateContentResponse>`` on one line, ended by a blank line
(CRLF, as Google sends it, unless the spec says ``lineend=``)::

    {"candidates":[{"content":{"parts":[PART],"role":"model"},"index":0}],
     "usageMetadata":{"promptTokenCount":P,"totalTokenCount":P},
     "modelVersion":"gemini-2.5-flash","responseId":"<per response>"}

One chunk per delta: each thought delta a ``{"text","thought":true}`` part (only when
the request asks ``includeThoughts``), each text delta a ``{"text"}`` part, each tool
call one whole ``{"functionCall":{"name","args"}}`` part. The last chunk (the last
delta's, or an empty text part when the response says nothing else) adds
``"finishReason":"STOP"`` and the whole ``usageMetadata`` (``candidatesTokenCount``,
``thoughtsTokenCount`` when the answer thinks, ``promptTokensDetails``). The response's
``thoughtSignature`` is on its first ``functionCall`` part, or, without calls, on its
last text part. ``at=`` counts every chunk but an empty last one.

Faults (``break_gemini``): ``reset``, ``close``, ``stall`` break the socket after the
cut; ``no_finish`` ends the body cleanly there (a cut after the last delta sends that
chunk without its finish); ``error`` (503 UNAVAILABLE), ``error_fatal`` (400
INVALID_ARGUMENT) and ``finish_error`` (500 INTERNAL) add Google's raw error object,
pretty-printed over several lines, after the events; ``error_data`` (and
``error_done``) the 503 as a ``data:`` event; ``malformed`` inserts a ``data:`` line
that is not JSON, and the stream goes on.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from gateway.chaos import gemini
from gateway.chaos.answer import Script, ScriptKey, encoded, resume_at, script_for, script_key
from gateway.chaos.faults import Ending
from gateway.chaos.render import EventFormat
from gateway.chaos.spec import LINE_ENDINGS, ChaosSpec

_BREAKS: dict[str, Ending] = {"reset": "reset", "close": "close", "stall": "stall"}
MALFORMED = b'{"candidates": ['  # a data line that is not JSON, as a buggy upstream sends

# One piece of the body: a data event's JSON (False), or raw bytes after the events (True).
Piece = tuple[bool, bytes]


@dataclass(frozen=True)
class GeminiScript:
    """One answer's parts, pre-encoded: thought and text deltas, calls (unsigned)."""

    script: Script
    reasoning: str
    thought_parts: tuple[bytes, ...]
    text_parts: tuple[bytes, ...]
    calls: tuple[dict[str, Any], ...]  # each call's {"functionCall": {"name","args"}} part


def _text_part(text: str) -> bytes:
    return b'{"text":' + orjson.dumps(text) + b"}"


def _thought_part(text: str) -> bytes:
    return b'{"text":' + orjson.dumps(text) + b',"thought":true}'


@functools.lru_cache(maxsize=256)
def _gemini_script(key: ScriptKey) -> GeminiScript:
    script = script_for(key)
    thoughts, text, _ = encoded(script, reasoning=_thought_part, text=_text_part)
    calls = tuple(
        {"functionCall": {"name": call.name, "args": orjson.loads(call.arguments)}}
        for call in script.tool_calls
    )
    return GeminiScript(script, "".join(script.reasoning_deltas), thoughts, text, calls)


def gemini_script(spec: ChaosSpec) -> GeminiScript:
    """The answer of ``spec`` (``script_for``) with its Gemini parts pre-encoded."""
    return _gemini_script(script_key(spec))


def response_id() -> str:
    """A new ``responseId``, shaped as Google's (23 URL-safe characters)."""
    return secrets.token_urlsafe(18)[:23]


def usage(prompt: int, candidates: int | None = None, thoughts: int = 0) -> dict[str, Any]:
    """``usageMetadata``: a streaming chunk's (``candidates`` None), or the whole one."""
    if candidates is None:
        return {"promptTokenCount": prompt, "totalTokenCount": prompt}
    whole: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if thoughts:
        whole["thoughtsTokenCount"] = thoughts
    return whole


class GeminiPlan(NamedTuple):
    """The data events of one stream (the last one finishing it), whether each carries a
    delta (what ``at=`` counts), the last event without its finish (sent when a fault
    cuts after it), and the whole response (``generateContent``'s answer)."""

    events: list[bytes]
    counts: list[bool]
    unfinished: bytes
    response: dict[str, Any]


def gemini_plan(
    answer: GeminiScript,
    prefix: str = "",
    echo: str = "",
    deltas: Sequence[str] | None = None,
    *,
    door: str = gemini.DEVELOPER,
    thoughts: bool = False,
    model_version: str = gemini.MODEL_VERSION,
    prompt_tokens: int = 11,
    identity: str | None = None,
) -> GeminiPlan:
    """The chunks of a stream resuming after ``prefix`` of the answer text.

    As ``chat_plan``: the thoughts come again on a continuation, the text resumes
    mid-delta if the prefix ended there (after ``echo``), tool calls come whole.
    ``deltas`` (``attempt_deltas``), when given, are the text after the prefix. The
    signatures are ``door``'s; ``thoughts``: the request asked ``includeThoughts``.
    """
    script = answer.script
    identity = response_id() if identity is None else identity
    if deltas is None:
        remainder, resume = resume_at(script, prefix)
        texts = [piece for piece in (echo, remainder) if piece]
        text_parts = [_text_part(piece) for piece in texts] + list(answer.text_parts[resume:])
        texts += script.text_deltas[resume:]
    else:
        texts = [piece for piece in (echo, *deltas) if piece]
        text_parts = [_text_part(piece) for piece in texts]
    thought_parts = list(answer.thought_parts) if thoughts else []
    calls = [dict(call) for call in answer.calls]
    if calls:
        calls[0]["thoughtSignature"] = gemini.thought_signature(door, calls[0])
    call_parts = [orjson.dumps(call) for call in calls]
    last_text: dict[str, Any] = {"text": texts[-1] if texts else ""}
    if not calls:
        last_text["thoughtSignature"] = gemini.thought_signature(door, last_text)
    parts = thought_parts + text_parts + call_parts
    counts = [True] * len(parts)
    if not calls and not text_parts:  # the signature needs a text part: an empty one
        parts.append(_text_part(""))
        counts.append(False)
    thinking = len(script.reasoning_deltas)
    whole_usage = usage(prompt_tokens, len(text_parts) + len(call_parts), thinking)
    tail = b',"modelVersion":' + orjson.dumps(model_version)
    tail += b',"responseId":' + orjson.dumps(identity) + b"}"
    head = b'{"candidates":[{"content":{"parts":['
    running = b'],"role":"model"},"index":0}],"usageMetadata":'
    running += orjson.dumps(usage(prompt_tokens))
    finishing = b'],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":'
    finishing += orjson.dumps(whole_usage)
    events = [head + part + running + tail for part in parts]
    unfinished = events[-1]
    last_part = parts[-1] if calls else orjson.dumps(last_text)
    events[-1] = head + last_part + finishing + tail

    merged: list[dict[str, Any]] = []
    if thought_parts:
        merged.append({"text": answer.reasoning, "thought": True})
    said = "".join(texts)
    if said or not calls:
        text = {"text": said}
        if not calls:
            text["thoughtSignature"] = gemini.thought_signature(door, text)
        merged.append(text)
    merged += calls
    candidate = {"content": {"parts": merged, "role": "model"}, "finishReason": "STOP", "index": 0}
    response = {
        "candidates": [candidate],
        "usageMetadata": whole_usage,
        "modelVersion": model_version,
        "responseId": identity,
    }
    return GeminiPlan(events, counts, unfinished, response)


def break_gemini(fault: str | None, cut: int, plan: GeminiPlan) -> tuple[list[Piece], Ending]:
    """The pieces a stream sends under ``fault``, cut before event ``cut``
    (``faults.fault_cut`` of ``plan.counts``), and how its body ends."""
    events = [(False, event) for event in plan.events]
    if fault is None:
        return events, "end"
    if fault == "malformed":
        return events[:cut] + [(False, MALFORMED)] + events[cut:], "end"
    sent = events[:cut]
    if cut >= len(events) and sent:  # after the last delta: not its finish
        sent[-1] = (False, plan.unfinished)
    if fault in gemini.IN_BAND_ERRORS:
        (code, status, message), raw = gemini.IN_BAND_ERRORS[fault]
        if raw:
            return sent + [(True, gemini.error_body(code, status, message))], "end"
        return sent + [(False, gemini.compact_error(code, status, message))], "end"
    if fault == "no_finish":
        return sent, "end"
    if fault in _BREAKS:
        return sent, _BREAKS[fault]
    raise ValueError(f"not a stream fault: {fault!r}")


def encode(pieces: list[Piece], spec: ChaosSpec) -> list[bytes]:
    """The bytes of each piece: ``data: <json>`` and a blank line (CRLF unless the spec
    says ``lineend=``), or a raw error object as it is."""
    explicit = "lineend=" in spec.source.replace(" ", "")
    line_end = spec.line_ending if explicit else LINE_ENDINGS["crlf"]
    events = EventFormat(line_end, spec.comments)
    return [data if raw else events.event(data, index) for index, (raw, data) in enumerate(pieces)]


def non_streaming(plan: GeminiPlan, fault: str | None) -> tuple[int, bytes] | None:
    """What ``generateContent`` answers under an in-band fault: its error status and body
    (None: the whole response; ``reset``/``close`` cut it, as for the other dialects)."""
    if fault in gemini.IN_BAND_ERRORS:
        (code, status, message), _ = gemini.IN_BAND_ERRORS[fault]
        return code, gemini.error_body(code, status, message)
    return None


def count_tokens(prompt_tokens: int) -> bytes:
    """``countTokens``'s answer."""
    details = [{"modality": "TEXT", "tokenCount": prompt_tokens}]
    return orjson.dumps({"totalTokens": prompt_tokens, "promptTokensDetails": details})

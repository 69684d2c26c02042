"""The Gemini client stream: one answer spliced from one or more upstream legs (section 2b).

Pure, like the other splicers: upstream chunks in, client chunks out, and a record of
what was sent in the run's ``GeminiAccumulator`` (``gemini_items``). See
``gateway.protocols.gemini`` for what the client is promised and the rest of the adapter.

A Gemini chunk is a whole ``GenerateContentResponse``: its candidate's parts, and
usage. Text and thought parts stream as they come (a later leg's text through the
seam, its thoughts not at all once the client has any part). A ``functionCall`` part
arrives whole, but is held until the next chunk that says something (or the end): if
the stream breaks right after it, the answer ends with it and ``finishReason`` on the
same chunk, so no chunk the client gets is ever without content parts (the google-genai
chat history drops a turn that has one). The chunk with ``finishReason`` is the last.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import GatewayError, google_error
from gateway.protocols.gemini_items import IDENTITY_FIELDS, SIGNATURE, GeminiAccumulator
from gateway.recovery.events import Chunk
from gateway.recovery.legs import Legs
from gateway.recovery.plan import Sent


def frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class GeminiSplicer(Legs):
    def __init__(self, accumulator: GeminiAccumulator) -> None:
        super().__init__(accumulator)
        self.sent: GeminiAccumulator = accumulator
        self._held: list[dict[str, Any]] = []  # this leg's parts held behind a function call

    # -- what recovery needs to know -------------------------------------------------

    def in_flight(self) -> list[str]:
        return list(self._dropped)  # a held call is whole: it is never dropped

    def held_calls(self) -> list[tuple[str, str]]:
        calls = [part["functionCall"] for part in self._held if "functionCall" in part]
        return [
            (str(c.get("name") or ""), orjson.dumps(c.get("args") or {}).decode()) for c in calls
        ]

    def forget_leg(self) -> None:
        self._held.clear()

    def snapshot(self) -> Sent:
        # A held call is whole: it counts as the client's, and a break ends with it.
        held = sum("functionCall" in part for part in self._held)
        sent = self.sent
        return Sent(sent.text_chars, len(sent.tool_calls) + held, bool(self._dropped))

    # -- chunks -----------------------------------------------------------------------

    def feed(self, chunk: Chunk) -> bytes | None:
        if self.finished:
            return None
        obj, sent = chunk.obj, self.sent
        first = sent.response is None
        if first:
            sent.response = {k: obj[k] for k in IDENTITY_FIELDS if k in obj}
            sent.identity = {"id": obj.get("responseId"), "model": obj.get("modelVersion")}
            sent.role = "model"
        usage = obj.get("usageMetadata")
        if type(usage) is dict:
            sent.set_usage(self.leg, usage)
        candidates = obj.get("candidates")
        if type(candidates) is not list or not candidates or type(candidates[0]) is not dict:
            feedback = obj.get("promptFeedback")
            if type(feedback) is dict and feedback.get("blockReason"):
                # The prompt was refused: an answer of its own, which ends the stream.
                sent.prompt_feedback = feedback
                sent.finish_reason = str(feedback["blockReason"])
                self.finished = True
                return self._render(obj, None, chunk.data if self.leg == 0 else None)
            return None  # usage alone: summed into the last chunk
        candidate = candidates[0]
        content = candidate.get("content")
        parts = content.get("parts") if type(content) is dict else None
        kept, changed, calls = self._parts(parts if type(parts) is list else [])
        reason = candidate.get("finishReason")
        if type(reason) is str and reason:
            data = chunk.data if self.leg == 0 and not changed else None
            return self._finish(obj, candidate, kept, reason, data)
        if calls:
            self._held += kept  # until the next chunk that says something, or the end
            return None
        if not kept:
            return None
        if self._held:
            kept, changed = self._held + kept, True
            self._held = []
        self._record(kept, candidate)
        return self._render(obj, kept, chunk.data if self.leg == 0 and not changed else None)

    def _parts(self, parts: list[Any]) -> tuple[list[dict[str, Any]], bool, bool]:
        """The parts of an upstream chunk as the client gets them; whether any changed;
        whether it holds a call."""
        kept: list[dict[str, Any]] = []
        changed = calls = False
        later = self.leg > 0 and self.sent.has_parts
        for part in parts:
            if type(part) is not dict:
                changed = True
                continue
            text = part.get("text")
            if part.get("thought") is True:
                if later:  # the client has its thoughts, and more after them
                    changed = True
                    if SIGNATURE in part:  # relayed on the part it came on, its text
                        # left out, as Gemini's own empty signature carriers are
                        kept.append({"text": "", "thought": True, SIGNATURE: part[SIGNATURE]})
                    continue
            elif type(part.get("functionCall")) is dict:
                part, renamed = self._call(part)
                changed, calls = changed or renamed, True
            elif type(text) is str and self.seam is not None:
                trimmed = self.seam.feed(text)
                if trimmed != text:
                    changed = True
                    if not trimmed and SIGNATURE not in part:
                        continue
                    part = part | {"text": trimmed}
            kept.append(part)
        return kept, changed, calls

    def _call(self, part: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """A call as the client gets it: an ``id`` (where the upstream gives one) that no
        other call of the answer has (a later leg may number its calls anew)."""
        call = part["functionCall"]
        call_id = call.get("id")
        if type(call_id) is not str:
            return part, False
        ids = {c.id for c in self.sent.tool_calls} | {
            p["functionCall"].get("id") for p in self._held if "functionCall" in p
        }
        if call_id not in ids:
            return part, False
        unique = f"{call_id}_{len(ids)}"
        return part | {"functionCall": call | {"id": unique}}, True

    def _finish(
        self,
        obj: dict[str, Any],
        candidate: dict[str, Any],
        kept: list[dict[str, Any]],
        reason: str,
        data: bytes | None,
    ) -> bytes:
        """The chunk with ``finishReason``: the last, with what was held and what the seam
        still held, and usage summed over legs (``data``: the bytes received, if they
        can go as they are)."""
        rest = self.seam.flush() if self.seam is not None else ""
        parts = self._held + kept + ([{"text": rest}] if rest else [])
        if self._held or rest or not kept:
            data = None
        self._held = []
        if not parts:
            # Never a chunk without parts (the SDK's chat history would drop the turn).
            parts = [{"text": ""}]
        self._record(parts, candidate)
        self.sent.finish_reason = reason
        self.finished = True
        return self._render(obj, parts, data)

    def _record(self, parts: list[dict[str, Any]], candidate: dict[str, Any]) -> None:
        sent, origin = self.sent, self.sent.origin
        for part in parts:
            sent.record(part, origin)
        sent.last_candidate = candidate

    def synthesize_tool_use(self) -> bytes:
        """End the answer with the calls the client has, and those held (whole)."""
        return self._end("STOP")

    def end_at_budget(self) -> bytes:
        """End the answer where its ``maxOutputTokens`` ran out (FinishAtBudget)."""
        return self._end("MAX_TOKENS")

    def _end(self, reason: str) -> bytes:
        parts, self._held = self._held, []
        if not parts:
            parts = [{"text": ""}]
        self._record(parts, self.sent.candidate)
        self.sent.finish_reason = reason
        self.finished = True
        candidate = self.sent.candidate | {"finishReason": reason}
        obj = {"candidates": [candidate], "usageMetadata": self.sent.usage or {}}
        return self._render(obj, parts, None)

    def close(self) -> bytes:
        return b""  # the chunk with finishReason was the end

    def fail(self, error: GatewayError) -> bytes:
        self.finished = True
        return error_object(error)

    # -- output -----------------------------------------------------------------------

    def _render(
        self, obj: dict[str, Any], parts: list[dict[str, Any]] | None, data: bytes | None
    ) -> bytes:
        """A client chunk: ``data``, the bytes received, where nothing about it changed
        (the first leg, as a rule), else re-encoded with the client's identity and usage
        summed over legs."""
        if data is not None and b"\n" not in data:
            return frame(data)
        out = dict(obj)
        if parts is not None:
            candidates = obj.get("candidates")
            candidate = candidates[0] if type(candidates) is list and candidates else {}
            content = candidate.get("content")
            content = content if type(content) is dict else {"role": "model"}
            out["candidates"] = [candidate | {"content": content | {"parts": parts}}]
        out |= self.sent.response or {}
        if "usageMetadata" in obj:
            usage = self.sent.usage
            if usage is not None:
                out["usageMetadata"] = usage
        return frame(orjson.dumps(out))


def error_code(error: GatewayError) -> int:
    """The HTTP code a failed stream's error names: the upstream's refusal is the client's
    to fix (400); anything else a server error both SDKs raise on."""
    if getattr(error, "fatal", False):
        return 400
    status = error.status_code
    return status if 400 <= status < 600 else 500


def error_object(error: GatewayError) -> bytes:
    """The end of a stream that cannot be completed: Google's error object, raw (not a
    ``data:`` event) and in one write. The JS SDK (Gemini CLI) raises only on such an
    object arriving whole in one read; the Python SDK raises on it too."""
    return orjson.dumps(google_error(error_code(error), error.message)) + b"\n\n"

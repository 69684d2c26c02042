"""What a Gemini client holds: the parts of its answer, and the run's accumulator of them.

The splicer (``gemini_splice``) decides what goes out; this is the record of what went:
the answer's parts as the client assembles them (consecutive text of one kind merged,
each ``thoughtSignature`` on the part it came on), the first leg's identity
(``responseId``, ``modelVersion``), the candidate's last metadata, and the assembled
``GenerateContentResponse``.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.recovery.accumulator import RunAccumulator, ToolCall

USAGE_COUNTS = ("promptTokenCount", "candidatesTokenCount", "totalTokenCount")
SIGNATURE = "thoughtSignature"
# What a response says of itself, besides its candidates and usage: kept from the first
# leg, so every chunk the client gets names one response.
IDENTITY_FIELDS = ("responseId", "modelVersion", "createTime")
_PLAIN = frozenset({"text", "thought"})  # a part of text alone, merged into the last


class GeminiAccumulator(RunAccumulator):
    """What the client was sent, with the Gemini-only parts: the parts and who signed them.

    Text merged into a part is kept as a list of pieces, joined only when the parts are
    read (a continuation, the assembled answer): the per-chunk cost stays constant."""

    usage_counts = USAGE_COUNTS

    def __init__(self) -> None:
        super().__init__()
        self.response: dict[str, Any] | None = None  # the identity fields the client got
        self._parts: list[dict[str, Any]] = []  # a merged part's text in _texts, by index
        self._texts: dict[int, list[str]] = {}
        # The upstream kind whose leg produced each part (None: not known, a takeover's
        # replay): a signature goes back only to the provider that made it.
        self.origins: list[str | None] = []
        # The last candidate the client was sent parts of: its other fields (safety
        # ratings, citations…) go on a chunk the gateway writes itself, and the answer.
        self.last_candidate: dict[str, Any] = {}
        self.prompt_feedback: Any = None

    @property
    def candidate(self) -> dict[str, Any]:
        """The last candidate's fields, but its content and finish."""
        return {
            k: v for k, v in self.last_candidate.items() if k not in ("content", "finishReason")
        }

    @property
    def has_parts(self) -> bool:
        return bool(self._parts)

    @property
    def parts(self) -> list[dict[str, Any]]:
        """The answer's parts as the client assembles them."""
        parts = list(self._parts)
        for index, texts in self._texts.items():
            parts[index] = parts[index] | {"text": "".join(texts)}
        return parts

    def record(self, part: dict[str, Any], origin: str | None) -> None:
        """A part the client was sent. Text of one kind (answer, thought) goes on the last
        part, as the assembled answer has it, but a signed part stays as it came: its
        signature is of that part (and the continuation sends it back so)."""
        text = part.get("text")
        if type(text) is str:
            thought = part.get("thought") is True
            if thought:
                self.add_reasoning("thought", text)
            else:
                self.add_text(text)
            index = len(self._parts) - 1
            last = self._parts[-1] if self._parts else None
            if (
                last is not None
                and type(last.get("text")) is str
                and (last.get("thought") is True) == thought
                and SIGNATURE not in last
                and self.origins[-1] == origin
                and part.keys() <= _PLAIN
            ):
                self._texts.setdefault(index, [last["text"]]).append(text)
                return
        call = part.get("functionCall")
        if type(call) is dict:
            name = call.get("name")
            arguments = orjson.dumps(call.get("args") or {}).decode()
            call_id = call.get("id")
            self.tool_calls.append(
                ToolCall(
                    len(self.tool_calls),
                    call_id if type(call_id) is str else f"call_{len(self.tool_calls)}",
                    name if type(name) is str else "",
                    arguments,
                )
            )
        self._parts.append(dict(part))
        self.origins.append(origin)

    def response_object(self) -> dict[str, Any]:
        """The assembled ``GenerateContentResponse`` (a non-streaming answer)."""
        candidate = dict(self.candidate)
        candidate["content"] = {"parts": self.parts, "role": "model"}
        if self.finish_reason is not None:
            candidate["finishReason"] = self.finish_reason
        candidate.setdefault("index", 0)
        response: dict[str, Any] = {"candidates": [candidate]}
        if self.prompt_feedback is not None:
            response["promptFeedback"] = self.prompt_feedback
        usage = self.usage
        if usage is not None:
            response["usageMetadata"] = usage
        return response | (self.response or {})

"""What a Responses client holds: its output items, and the run's accumulator of them.

The splicer (``responses_splice``) decides what goes out; this is the record of what
went: each item as the client has it (a message's text and refusal, a reasoning
item's summary, a held item's whole ``done``), the numbering, the first leg's
response object, and the terminal event's ``output`` and ``usage`` built from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.recovery.accumulator import RunAccumulator

USAGE_COUNTS = ("input_tokens", "output_tokens", "total_tokens")
# What the openai SDK's ResponseUsage requires in its details (3.57: cache_write_tokens).
REQUIRED_DETAILS = {
    "input_tokens_details": ("cached_tokens", "cache_write_tokens"),
    "output_tokens_details": ("reasoning_tokens",),
}


@dataclass(slots=True)
class Item:
    """One output item as the client has it."""

    index: int
    id: str
    type: str
    added: dict[str, Any]  # the item as its output_item.added said
    done: dict[str, Any] | None = None  # as its output_item.done said (whole), once sent
    text: list[str] = field(default_factory=list)  # a message's output_text
    refusal: list[str] = field(default_factory=list)
    parts: int = 0  # content parts the client was told of (a message)
    text_done: bool = False  # its output_text.done went out: no more text joins it
    part_done: bool = False  # its content_part.done went out
    summary: dict[int, list[str]] = field(default_factory=dict)  # a reasoning item's

    def add_summary(self, index: Any, delta: str) -> None:
        self.summary.setdefault(index if type(index) is int else 0, []).append(delta)

    def final(self) -> dict[str, Any]:
        """The item for a terminal event's ``output``."""
        if self.type == "message":
            return self.message("completed" if self.done is not None else "incomplete")
        if self.done is not None:
            return self.done
        unfinished = dict(self.added)
        if "status" in unfinished:
            unfinished["status"] = "incomplete"
        if self.summary:  # reasoning cut short: what the client was sent of it
            unfinished["summary"] = [
                {"type": "summary_text", "text": "".join(self.summary[i])}
                for i in sorted(self.summary)
            ]
        return unfinished

    def message(self, status: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = [
            {"type": "output_text", "text": "".join(self.text), "annotations": []}
        ]
        if self.refusal:
            content.append({"type": "refusal", "refusal": "".join(self.refusal)})
        return self.added | {"status": status, "content": content}


class ResponsesAccumulator(RunAccumulator):
    """What the client was sent, with the Responses-only parts: items and numbering."""

    usage_counts = USAGE_COUNTS

    def __init__(self) -> None:
        super().__init__()
        self.response: dict[str, Any] | None = None  # the first leg's response object
        self.items: list[Item] = []
        self.seq = 0  # events sent: the next sequence_number
        self.status: str | None = None
        self.incomplete_details: Any = None

    def open_message(self) -> Item | None:
        for item in reversed(self.items):
            if item.type == "message":
                return item if item.done is None and not item.text_done else None
        return None

    def client_usage(self) -> dict[str, Any]:
        """Usage as a Response carries it, whole (never null: a synthesized end, or one
        after a recovery, has it too): summed over legs with every field they reported
        (``RunAccumulator.usage``), and the token details the Response type requires
        where no leg reported them (an estimate, a server that leaves them out)."""
        usage = dict(self.usage or dict.fromkeys(USAGE_COUNTS, 0))
        for key, required in REQUIRED_DETAILS.items():
            details = usage.get(key)
            details = dict(details) if isinstance(details, dict) else {}
            for name in required:
                details.setdefault(name, 0)
            usage[key] = details
        return usage

    def output(self) -> list[dict[str, Any]]:
        return [item.final() for item in self.items]

    def response_object(self, status: str) -> dict[str, Any]:
        response = dict(self.response or {})
        response["status"] = status
        response["output"] = self.output()
        response["usage"] = self.client_usage()
        if status == "incomplete":
            response["incomplete_details"] = self.incomplete_details
        return response

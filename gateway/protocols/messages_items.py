"""What a Messages client holds: its content blocks, and the run's accumulator of them.

The splicer (``messages_splice``) decides what goes out; this is the record of what
went: each block as the client has it (text, thinking with its signature, a tool
use's input), the first leg's ``message_start``, and the assembled Message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.recovery.accumulator import RunAccumulator

USAGE_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
THINKING = frozenset({"thinking", "redacted_thinking"})
# Blocks whose input streams as input_json_delta. Only a tool_use is the client's to
# run (a tool call, for recovery plans); a server tool's is run by the provider.
TOOL_USES = frozenset({"tool_use", "server_tool_use"})


@dataclass(slots=True)
class Block:
    """One content block as the client has it."""

    index: int
    type: str
    start: dict[str, Any]  # the content_block as its content_block_start said
    text: list[str] = field(default_factory=list)  # a text or thinking block's
    json: list[str] = field(default_factory=list)  # a tool use's partial_json
    citations: list[Any] = field(default_factory=list)
    signature: str | None = None
    stopped: bool = False

    def final(self) -> dict[str, Any]:
        """The block as the assembled Message holds it."""
        block = dict(self.start)
        if self.type == "text":
            block["text"] = "".join(self.text)
            if self.citations:
                block["citations"] = self.citations
        elif self.type == "thinking":
            block["thinking"] = "".join(self.text)
            block["signature"] = self.signature or ""
        elif self.type in TOOL_USES and self.json:  # else: the input its start gave
            try:
                block["input"] = orjson.loads("".join(self.json))
            except orjson.JSONDecodeError:
                block["input"] = {}
        return block


class MessagesAccumulator(RunAccumulator):
    """What the client was sent, with the Messages-only parts: the message and its blocks."""

    usage_counts = USAGE_COUNTS

    def __init__(self) -> None:
        super().__init__()
        self.message: dict[str, Any] | None = None  # the message_start the client got
        self.blocks: list[Block] = []
        self.stop_sequence: Any = None

    def open_text(self) -> Block | None:
        """The client's last block, if it is text it may still be sent more of."""
        if self.blocks and self.blocks[-1].type == "text" and not self.blocks[-1].stopped:
            return self.blocks[-1]
        return None

    def add_usage(self, leg: int, usage: dict[str, Any]) -> None:
        """A leg's usage so far: message_start's, then message_delta's (cumulative) over it."""
        self.set_usage(leg, self.usage_by_leg.get(leg, {}) | usage)

    def message_object(self) -> dict[str, Any]:
        """The assembled Message (a non-streaming answer)."""
        message = dict(self.message or {"type": "message", "role": "assistant"})
        message["content"] = [block.final() for block in self.blocks]
        message["stop_reason"] = self.finish_reason
        message["stop_sequence"] = self.stop_sequence
        message["usage"] = self.usage or {"input_tokens": 0, "output_tokens": 0}
        return message

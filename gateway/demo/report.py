"""How the demo shows it: a terminal report, live text, one line per finding."""

from __future__ import annotations

import itertools
import re
import shutil
import textwrap
import unicodedata
from typing import TextIO

import orjson

from gateway.chaos import (
    ToolCall,
)
from gateway.demo.checks import Rescue, valid_json
from gateway.demo.client import Received
from gateway.recovery.classify import DESCRIPTIONS, Cause

_PIECES = re.compile(r"\s*\S+|\s+")
LABEL = 10  # width of a field's label


def columns(text: str) -> int:
    """Terminal columns, roughly: wide East Asian characters and emoji take two."""
    total = 0
    for char in text:
        if unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        total += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return total


class Style:
    """ANSI colour, only when writing to a terminal (and ``NO_COLOR`` is not set)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text


class Report:
    def __init__(self, out: TextIO, style: Style) -> None:
        self.out = out
        self.style = style
        self.width = min(shutil.get_terminal_size((100, 24)).columns, 100) - 1
        self.indent = " " * (5 + LABEL)
        self._column = 0

    def paragraph(self, text: str, indent: str = "", code: str = "") -> None:
        pieces = textwrap.wrap(text, self.width, subsequent_indent=indent, break_on_hyphens=False)
        for piece in pieces:
            self.line(self.style(piece, code) if code else piece)

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def field(self, label: str, text: str) -> None:
        first = "     " + self.style(label.ljust(LABEL), "2")
        wrapped = textwrap.wrap(
            text,
            self.width - len(self.indent),
            break_long_words=False,
            break_on_hyphens=False,
        )
        for index, piece in enumerate(wrapped or [""]):
            self.line((first if index == 0 else self.indent) + piece)

    def start_live(self, label: str) -> None:
        self.out.write("     " + self.style(label.ljust(LABEL), "2") + self._colour_on())
        self._column = len(self.indent)

    def live(self, text: str) -> None:
        """Write streamed text as it arrives, wrapped under the field indent."""
        for piece in _PIECES.findall(text):
            if self._column > len(self.indent) and self._column + columns(piece) > self.width:
                self.out.write("\n" + self.indent)
                self._column = len(self.indent)
                piece = piece.lstrip()
            self.out.write(piece)
            self._column += columns(piece)
        self.out.flush()

    def live_colour(self, code: str) -> None:
        """Go on writing the live text in another colour (an SGR code, "33")."""
        if self.style.enabled:
            self.out.write(f"\033[{code}m")

    def end_live(self) -> None:
        self.line("\033[0m" if self.style.enabled else "")

    def _colour_on(self) -> str:
        return "\033[36m" if self.style.enabled else ""

    def verdict(self, question: str, problems: list[str]) -> None:
        answer = self.style("yes", "32;1") if not problems else self.style("no", "31;1")
        self.field("check", f"{question}: {answer}")
        for problem in problems:
            self.field("", "- " + problem)


def _quote(text: str) -> str:
    return orjson.dumps(text).decode()


def received_line(received: Received, seconds: float) -> str:
    parts = [f"{len(received.text)} characters"]
    if received.calls:
        parts.append(f"{len(received.calls)} tool call(s)")
    ending = [f"finish_reason {_quote(r)}" for r in received.finish_reasons]
    if received.error is not None:
        ending.append(f"an error event ({received.error.get('code')})")
    ending.append("[DONE]" if received.done else "no [DONE]")
    return f"{', '.join(parts)}, then {', '.join(ending)}  ({seconds:.1f} s)"


def responses_received_line(received: Received, seconds: float) -> str:
    parts = [f"{len(received.text)} characters in {len(received.sequence)} events"]
    if received.sequence:
        gapless = received.sequence == list(range(len(received.sequence)))
        numbers = f"sequence_number {received.sequence[0]}–{received.sequence[-1]}"
        parts.append(numbers + (" without a gap" if gapless else " WITH A GAP OR REPEAT"))
    if received.response_ids:
        ids = ", ".join(sorted(received.response_ids))
        parts.append(f"response id {ids}" if len(received.response_ids) == 1 else f"ids {ids}")
    if received.error is not None:
        ending = f"an error ({received.error.get('code')})"
    elif received.done:
        ending = f"response.completed (status {_quote(received.status or '')})"
    else:
        ending = "no terminal event"
    return f"{', '.join(parts)}; then {ending}  ({seconds:.1f} s)"


def messages_received_line(received: Received, seconds: float) -> str:
    blocks = ", ".join(received.blocks) or "none"
    whole = received.started == received.stopped == list(range(len(received.blocks)))
    parts = [
        f"{len(received.text)} characters",
        f"blocks {blocks} ({'each started and stopped once' if whole else 'NOT EACH WHOLE'})",
    ]
    if received.response_ids:
        ids = ", ".join(sorted(received.response_ids))
        parts.append(f"message id {ids}" if len(received.response_ids) == 1 else f"ids {ids}")
    ending = [f"stop_reason {_quote(r)}" for r in received.finish_reasons]
    if received.error is not None:
        ending.append(f"an error ({received.error.get('code')})")
    ending.append(f"{received.stops} message_stop" if received.stops != 1 else "message_stop")
    return f"{', '.join(parts)}; then {', '.join(ending)}  ({seconds:.1f} s)"


def gemini_received_line(received: Received, seconds: float) -> str:
    kinds = [kind for chunk in received.chunks for kind in chunk]
    counts = ", ".join(
        f"{kinds.count(kind)} {kind}"
        for kind in ("thought", "text", "function_call")
        if kind in kinds
    )
    every = "each with parts" if all(received.chunks) else "SOME WITHOUT PARTS"
    parts = [
        f"{len(received.text)} characters",
        f"{len(received.chunks)} chunks ({every}: {counts or 'none'})",
    ]
    if received.response_ids:
        ids = ", ".join(sorted(received.response_ids))
        parts.append(f"responseId {ids}" if len(received.response_ids) == 1 else f"ids {ids}")
    last = len(received.chunks) - 1
    ending = [
        f"finishReason {_quote(reason)}"
        + (" on the last chunk" if at == last else f" on chunk {at}")
        for reason, at in zip(received.finish_reasons, received.finished, strict=True)
    ] or ["no finishReason"]
    if received.error is not None:
        ending.append(f"an error ({received.error.get('code')})")
    return f"{', '.join(parts)}; then {', '.join(ending)}  ({seconds:.1f} s)"


def thoughts_line(received: Received) -> str:
    shown = received.thinking if len(received.thinking) <= 40 else received.thinking[:39] + "…"
    return f"{_quote(shown)}  ({len(received.thinking)} characters)"


def signature_line(received: Received) -> str:
    """The thoughtSignature the first function call carried."""
    if not received.signature:
        return "NONE on the function call"
    signature = received.signature
    return f"{signature[:16]}… ({len(signature)} characters of base64) on the function call"


def thinking_line(received: Received) -> str:
    shown = received.thinking if len(received.thinking) <= 40 else received.thinking[:39] + "…"
    signed = f"signature {received.signature}" if received.signature else "NOT SIGNED"
    return f"{_quote(shown)}  ({len(received.thinking)} characters, {signed})"


def broke_line(rescue: Rescue, received: Received) -> str:
    if not rescue.interruptions:
        return "nothing (the fault did not reach the gateway)"
    lines = []
    for index, (upstream, cause) in enumerate(rescue.interruptions):
        try:
            what = DESCRIPTIONS[Cause(cause)]
        except ValueError:
            what = "broke"
        # The request that followed a break says how far the client had got; after the
        # last one, if the stream ended in an error, the client's text does.
        if index < len(rescue.resumed_at):
            chars = rescue.resumed_at[index]
        else:
            chars = len(received.text) if received.error is not None else 0
        into = f", {chars} characters into the answer" if chars else ""
        lines.append(f"{cause}: upstream {upstream!r} {what}{into}")
    return "; then ".join(lines)


_PLANS = {
    "continue_text": "asked the upstream to continue the text the client already had (sent "
    "as the assistant's prefix)",
    "truncate_before_tool": "held back the half-written tool call (the client never saw it) and "
    "asked the upstream to continue the text; the calls came again, whole",
    "whole_restart": "nothing had reached the client yet: sent the same request again",
    "synthesize_tool_use": "finished with the tool calls already complete, without asking again",
}


def rescued_line(rescue: Rescue, received: Received) -> str:
    if not rescue.recoveries:
        return (
            "not retried: the error is not transient, so the client is told, in-band, "
            "instead of getting an answer that looks complete"
        )
    steps = []
    for (plan, outcome), group in itertools.groupby(rescue.recoveries):
        times = len(list(group))
        steps.append(
            plan
            + (f" ×{times}" if times > 1 else "")
            + ("" if outcome == "recovered" else f", {outcome}")
            + f": {_PLANS.get(plan, 'recovered')}"
        )
    return (
        "; ".join(steps)
        + f". {rescue.requests} upstream requests in all; the longest wait between two events "
        f"at the client: {received.longest_pause:.2f} s"
    )


def seam_line(text: str, at: int) -> str:
    """Where a continuation joins the text: the characters either side of ``at``."""
    before, after = text[max(0, at - 24) : at], text[at : at + 24]
    return f"…{_quote(before)} ‖ " + (_quote(after) + "…" if after else "the tool calls")


def tool_line(call: ToolCall) -> str:
    valid = "valid JSON" if valid_json(call.arguments) else "INVALID JSON"
    return f"{call.name}({call.arguments})  {valid}"


# -- the demo ------------------------------------------------------------------------

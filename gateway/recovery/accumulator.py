"""What the client of one run has been sent: the input to checkpoints and recovery plans.

The splicer records into it exactly what it emits, so after any number of legs
it describes the client's view, not any one upstream's. Growing strings are kept
as lists of parts, joined only when read, so the per-chunk cost stays constant
however long the answer gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.recovery.usage import LegMeasure, estimate_usage, output_spent, summed

REASONING_FIELDS = ("reasoning_content", "reasoning")
USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the client received whole."""

    index: int
    id: str
    name: str
    arguments: str
    type: str = "function"

    def as_delta(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def as_message_call(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }


class RunAccumulator:
    usage_counts: tuple[str, ...] = USAGE_COUNTS  # summed over legs (a protocol's own names)

    def __init__(self) -> None:
        self.identity: dict[str, Any] | None = None  # id, created, model, system_fingerprint
        self.role: str | None = None
        # The kind of upstream being asked or relayed (``Run.request_body``): a protocol
        # whose parts are signed for one provider (Gemini's) records who made each.
        self.origin: str | None = None
        self.finish_reason: str | None = None
        self.reasoning_field = REASONING_FIELDS[0]
        self.tool_calls: list[ToolCall] = []
        self.text_chars = 0
        self.reasoning_chars = 0
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._refusal: list[str] = []
        self._logprobs: dict[str, list[Any]] = {}  # "content" / "refusal": token entries
        self._usage_by_leg: dict[int, dict[str, Any]] = {}
        self._measures: dict[int, LegMeasure] = {}  # what the gateway saw of each leg
        self._restored_estimates: dict[int, dict[str, int]] = {}  # another replica's
        self._restored_spent: int | None = None  # another replica's output tokens

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def add_text(self, text: str) -> None:
        self._text.append(text)
        self.text_chars += len(text)

    def add_reasoning(self, field: str, text: str) -> None:
        self.reasoning_field = field
        self._reasoning.append(text)
        self.reasoning_chars += len(text)

    def add_refusal(self, text: str) -> None:
        self._refusal.append(text)

    def add_logprobs(self, logprobs: Any) -> None:
        """A released delta's ``logprobs``, kept for the assembled completion."""
        if isinstance(logprobs, dict):
            for kind, entries in logprobs.items():
                if isinstance(entries, list):
                    self._logprobs.setdefault(kind, []).extend(entries)

    def set_usage(self, leg: int, usage: dict[str, Any]) -> None:
        # Some providers repeat a running total on every chunk: keep the last per leg.
        self._usage_by_leg[leg] = usage

    @property
    def usage_by_leg(self) -> dict[int, dict[str, Any]]:
        """Usage as the upstreams reported it, by leg."""
        return self._usage_by_leg

    def measure(self, leg: int) -> LegMeasure:
        """What the gateway saw of ``leg`` (its request, its output): kept so that a leg
        that breaks before it reports usage still counts (``estimated_by_leg``)."""
        measure = self._measures.get(leg)
        if measure is None:
            measure = self._measures[leg] = LegMeasure()
        return measure

    def restore_estimates(self, estimates: dict[int, dict[str, int]]) -> None:
        """Estimates another replica made for the legs it relayed (a takeover)."""
        self._restored_estimates = estimates

    @property
    def estimated_by_leg(self) -> dict[int, dict[str, int]]:
        """Usage estimated for the legs that broke before they reported it whole: the user
        pays for them too (``gateway.recovery.usage``)."""
        counts = self.usage_counts
        estimates = dict(self._restored_estimates)
        # Calibrated on legs whose usage is final: not the leg in progress (Messages'
        # message_start reports an output of 1), until the answer finished.
        current = max(self._measures, default=None) if self.finish_reason is None else None
        complete = [
            (measure, self._usage_by_leg[leg])
            for leg, measure in self._measures.items()
            if not measure.broke and leg in self._usage_by_leg and leg != current
        ]
        for leg, measure in self._measures.items():
            if measure.broke:
                estimate = estimate_usage(measure, self._usage_by_leg.get(leg), complete, counts)
                if estimate is not None:
                    estimates[leg] = estimate
        return estimates

    def output_spent(self) -> int:
        """Output tokens every leg so far produced, reported or estimated per delta
        (``gateway.recovery.usage.output_spent``): the client's budget less this is
        what a continuation may ask for."""
        output = self.usage_counts[1]
        if self._restored_spent is not None:  # a takeover: what the other replica counted
            return self._restored_spent + output_spent(
                self._measures, self._usage_by_leg, {}, output
            )
        return output_spent(self._measures, self._usage_by_leg, self._restored_estimates, output)

    def restore_spent(self, spent: int | None) -> None:
        """The output tokens another replica's legs produced (a takeover; None: unknown,
        as in an older release's checkpoint: its estimates stand in)."""
        self._restored_spent = spent

    @property
    def usage(self) -> dict[str, Any] | None:
        """Usage summed over every leg, reported or estimated: the user pays for all of
        them; every field a leg reported kept (``summed``). None only when no leg was
        ever opened."""
        estimated = self.estimated_by_leg
        legs = [u for leg, u in self._usage_by_leg.items() if leg not in estimated]
        # A broken leg's estimate, over what it did report (Messages' cache counts).
        legs += [self._usage_by_leg.get(leg, {}) | usage for leg, usage in estimated.items()]
        if not legs:
            return None
        if len(legs) == 1 and not estimated:
            return legs[0]
        return summed(legs, self.usage_counts)

    @property
    def refusal(self) -> str:
        return "".join(self._refusal)

    @property
    def logprobs(self) -> dict[str, list[Any]]:
        return self._logprobs

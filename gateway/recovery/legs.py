"""What every protocol's splicer keeps from leg to leg (``gateway.protocols``).

Pure bookkeeping: the number of upstream responses spliced so far, whether the
answer finished, the seam of the current leg (and what earlier seams cut), and
the tool calls a stopped replica had in flight. A splicer adds its own wire
format on top; what it holds of the current leg it says in ``holding`` and
forgets in ``forget_leg``.
"""

from __future__ import annotations

from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.plan import CONTINUED, Plan, Position, Sent
from gateway.recovery.seam import SeamRule, Seams, SeamTrimmer

# Plans whose leg repeats some of what the client has first (a seam to trim).
SEAMED = CONTINUED | {Plan.VERIFIED_REPLAY}


class Legs:
    def __init__(self, accumulator: RunAccumulator) -> None:
        self.sent = accumulator
        self.leg = 0  # upstream responses started, minus one
        self.finished = False
        self.seam: SeamTrimmer | None = None
        self._seams = Seams()
        self._dropped: list[str] = []  # in flight when a replica stopped (``restore``)

    def holding(self) -> bool:
        """Whether a tool call of the current leg is begun and not released."""
        return False

    def forget_leg(self) -> None:
        """A new leg: what the splicer held of the broken one was never sent."""

    def resumable(self) -> Position | None:
        """Where the open leg's upstream response can be read again (a background
        response still generating), or None: it cannot be."""
        return None

    def restore(self, leg: int, in_flight: list[str]) -> None:
        """Continue a run rebuilt from a checkpoint: its accumulator is already ``sent``."""
        self.leg = leg
        self.finished = self.sent.finish_reason is not None
        self._dropped = in_flight

    @property
    def trimmed(self) -> int:
        """Characters trimmed at every seam of the run so far."""
        return self._seams.trimmed

    def seam_outcomes(self) -> list[str]:
        """What each decided seam of the run cut ("echo", "restart", "none")."""
        return self._seams.outcomes()

    def snapshot(self) -> Sent:
        in_flight = self.holding() or bool(self._dropped)
        return Sent(self.sent.text_chars, len(self.sent.tool_calls), in_flight)

    def begin_leg(self, plan: Plan, seam: SeamRule | None = None) -> None:
        """A new upstream response replaces the broken one.

        ``seam``: what this continuation is known to repeat first (None: nothing, it
        continues literally; so each of its deltas becomes one client event).
        """
        self.leg += 1
        self.forget_leg()
        self._dropped = []
        rule = seam if plan in SEAMED else None
        self.seam = self._seams.next_leg(self.sent.text, rule)

    def end_leg(self) -> None:
        """The leg broke: text held at the seam was never sent; the next leg redoes it."""
        if self.seam is not None:
            self.seam.discard()

"""Recovery strategies: how a run carries out a plan, one object per plan (ARCHITECTURE.md
section 4; STYLE.md: a policy the loop asks, as urllib3's ``Retry`` is).

``gateway.recovery.plan`` decides which plan fits what the client has; the plan's
strategy says what to do about it, and the run loop (``runs/run.py``) stays a loop:

- ``end(stream, fatal=...)``: the bytes that end the answer here, with no upstream call
  (``SynthesizeToolUse``, ``FinishAtBudget``), or None: ask an upstream;
- ``ask(need)``: this leg's request (``Ask``: its body; the seam, what its answer is known
  to repeat first and whether that is verified; whether it ends with an assistant message,
  so that a 4xx may be a refused prefill), or None when the leg cannot serve it.

What comes back is read by the protocol's splicer through the seam the ask named: cut
exactly, or, for a verified seam, never shown when it does not follow (``SeamDiverged``).

    restart.py       WholeRestart: the request again (nothing was sent)
    continuation.py  ContinueText, TruncateBeforeTool: the text so far, continued, with
                     what is left of the client's output budget
    replay.py        VerifiedReplay: the request again, kept once it repeated all that
                     was sent (structured output; a continuation that did not follow)
    endings.py       SynthesizeToolUse, FinishAtBudget: the answer ends here
    reattach.py      Reattach: the leg's own background response read again from where it
                     broke (no new leg, no seam)

A new strategy is a ``Plan`` and a module here.
"""

from __future__ import annotations

from gateway.recovery.plan import Plan
from gateway.runs.strategies.base import Ask, Need, Strategy
from gateway.runs.strategies.continuation import ContinueText, TruncateBeforeTool
from gateway.runs.strategies.endings import FinishAtBudget, SynthesizeToolUse
from gateway.runs.strategies.reattach import Reattach
from gateway.runs.strategies.replay import VerifiedReplay
from gateway.runs.strategies.restart import WholeRestart

__all__ = ["Ask", "Need", "Strategy", "strategy_for"]

_STRATEGIES: dict[Plan, Strategy] = {
    strategy.plan: strategy
    for strategy in (
        WholeRestart(),
        ContinueText(),
        TruncateBeforeTool(),
        VerifiedReplay(),
        SynthesizeToolUse(),
        FinishAtBudget(),
        Reattach(),
    )
}


def strategy_for(plan: Plan) -> Strategy:
    """The strategy that carries out ``plan`` (immutable: one for every run)."""
    return _STRATEGIES[plan]

"""WholeRestart: nothing (or only the role) was sent, so the request is simply asked
again; the client sees nothing unusual."""

from __future__ import annotations

from gateway.recovery.plan import Plan
from gateway.runs.strategies.base import Strategy


class WholeRestart(Strategy):
    plan = Plan.WHOLE_RESTART  # ``Strategy.ask``: the request as it is

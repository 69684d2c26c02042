"""The plans that end the answer with what the client has, with no upstream call."""

from __future__ import annotations

from gateway.protocols.base import ClientStream
from gateway.recovery.plan import Plan
from gateway.runs.strategies.base import Ask, Need, Strategy


class _Ending(Strategy):
    def ask(self, need: Need) -> Ask | None:
        return None  # never asked: the answer ended (or failed) first


class SynthesizeToolUse(_Ending):
    """Completed tool calls were sent: they are a usable answer on their own, whatever
    broke (a refusal included); a continuation could only add calls the client would
    then have to reconcile. The answer ends with them (``tool_calls``)."""

    plan = Plan.SYNTHESIZE_TOOL_USE

    def end(self, stream: ClientStream, *, fatal: bool) -> bytes:
        return stream.synthesize_tool_use()


class FinishAtBudget(_Ending):
    """The client's output budget is spent: the answer ends as the unbroken one would
    have (``length``, ``incomplete``, ``max_tokens``, ``MAX_TOKENS``), unless the break was
    a refusal, which is surfaced."""

    plan = Plan.FINISH_AT_BUDGET

    def end(self, stream: ClientStream, *, fatal: bool) -> bytes | None:
        return None if fatal else stream.end_at_budget()

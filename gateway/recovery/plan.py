"""Which recovery plan fits what the client already has (ARCHITECTURE.md section 4)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Plan(enum.StrEnum):
    # The leg's stream is read again from where it broke, on the same upstream: the
    # provider's own generation goes on (a background response: no new generation, no seam).
    REATTACH = "reattach"
    WHOLE_RESTART = "whole_restart"  # nothing (or only the role) sent: ask again
    CONTINUE_TEXT = "continue_text"  # text sent: continue it from the prefix
    SYNTHESIZE_TOOL_USE = "synthesize_tool_use"  # completed calls sent: finish with them
    TRUNCATE_BEFORE_TOOL = "truncate_before_tool"  # text + a half call: drop it, continue
    # The client's output budget is spent: end as the unbroken answer would (``length``).
    FINISH_AT_BUDGET = "finish_at_budget"
    # The client's request again, kept only if it begins with all the client has: for
    # an answer a continuation cannot extend exactly (structured output), or after a
    # continuation that did not do as asked.
    VERIFIED_REPLAY = "verified_replay"


CONTINUED = frozenset({Plan.CONTINUE_TEXT, Plan.TRUNCATE_BEFORE_TOOL})


@dataclass(frozen=True, slots=True)
class Position:
    """Where a leg's upstream response can be read again: the provider's own id for it,
    and the last of its events received (its ``sequence_number``)."""

    response: str
    after: int


@dataclass(frozen=True, slots=True)
class Sent:
    """The part of a run's snapshot a plan is decided from."""

    text_chars: int
    completed_tool_calls: int
    in_flight_tool_call: bool


def plan_recovery(
    sent: Sent,
    *,
    budget_left: int | None = None,
    structured: bool = False,
    diverged: bool = False,
    resumable: bool = False,
) -> Plan:
    """The plan for a stream that broke after ``sent``.

    ``budget_left``: output tokens the client's request still allows (None: it set no
    limit); ``structured``: the request asks for a document in a schema, which a
    continuation cannot extend exactly (a server's grammar does not carry the prefix's
    state, a prompt-mode reply opens a new document); ``diverged``: the last leg was a
    continuation that did not do as asked; ``resumable``: the leg's own generation goes
    on upstream and can be read again from where it broke, which beats every other plan
    (the unbroken answer itself, at no new generation's cost).
    """
    if resumable:
        return Plan.REATTACH
    if sent.completed_tool_calls:
        # The completed calls are a usable answer on their own; a continuation
        # could only add calls the client would then have to reconcile.
        return Plan.SYNTHESIZE_TOOL_USE
    if not sent.text_chars:
        return Plan.WHOLE_RESTART
    if structured or diverged:
        # The whole request again, with its whole budget: it ends where the unbroken
        # answer does by itself.
        return Plan.VERIFIED_REPLAY
    if budget_left is not None and budget_left <= 0:
        return Plan.FINISH_AT_BUDGET
    return Plan.TRUNCATE_BEFORE_TOOL if sent.in_flight_tool_call else Plan.CONTINUE_TEXT

"""Which recovery plan fits what the client already has (ARCHITECTURE.md section 4)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Plan(enum.StrEnum):
    WHOLE_RESTART = "whole_restart"  # nothing (or only the role) sent: ask again
    CONTINUE_TEXT = "continue_text"  # text sent: continue it from the prefix
    SYNTHESIZE_TOOL_USE = "synthesize_tool_use"  # completed calls sent: finish with them
    TRUNCATE_BEFORE_TOOL = "truncate_before_tool"  # text + a half call: drop it, continue


@dataclass(frozen=True, slots=True)
class Sent:
    """The part of a run's snapshot a plan is decided from."""

    text_chars: int
    completed_tool_calls: int
    in_flight_tool_call: bool


def plan_recovery(sent: Sent) -> Plan:
    if sent.completed_tool_calls:
        # The completed calls are a usable answer on their own; a continuation
        # could only add calls the client would then have to reconcile.
        return Plan.SYNTHESIZE_TOOL_USE
    if sent.text_chars:
        return Plan.TRUNCATE_BEFORE_TOOL if sent.in_flight_tool_call else Plan.CONTINUE_TEXT
    return Plan.WHOLE_RESTART

from __future__ import annotations

from typing import Any

import pytest

from gateway.recovery.plan import Plan, Sent, plan_recovery


@pytest.mark.parametrize(
    ("sent", "plan"),
    [
        (Sent(0, 0, False), Plan.WHOLE_RESTART),  # R4: empty snapshot
        (Sent(12, 0, False), Plan.CONTINUE_TEXT),  # R1: text only
        (Sent(0, 1, False), Plan.SYNTHESIZE_TOOL_USE),  # R2: a completed call
        (Sent(12, 2, True), Plan.SYNTHESIZE_TOOL_USE),  # completed calls win over the rest
        (Sent(12, 0, True), Plan.TRUNCATE_BEFORE_TOOL),  # R3: text + half a call
        (Sent(0, 0, True), Plan.WHOLE_RESTART),  # only a half call
    ],
)
def test_plan_follows_the_architecture_table(sent: Sent, plan: Plan) -> None:
    assert plan_recovery(sent) is plan


@pytest.mark.parametrize(
    ("sent", "options", "plan"),
    [
        # The client's budget is spent: the answer ends as the unbroken one would.
        (Sent(12, 0, False), {"budget_left": 0}, Plan.FINISH_AT_BUDGET),
        (Sent(12, 0, True), {"budget_left": -3}, Plan.FINISH_AT_BUDGET),
        (Sent(12, 0, False), {"budget_left": 1}, Plan.CONTINUE_TEXT),
        # ... unless nothing was sent: the request again, with its whole budget.
        (Sent(0, 0, False), {"budget_left": 0}, Plan.WHOLE_RESTART),
        # A document in a schema, or a continuation that did not do as asked: the
        # request again, verified; its own budget ends it where the unbroken one ends.
        (Sent(12, 0, False), {"structured": True}, Plan.VERIFIED_REPLAY),
        (Sent(12, 0, True), {"structured": True, "budget_left": 0}, Plan.VERIFIED_REPLAY),
        (Sent(12, 0, False), {"diverged": True}, Plan.VERIFIED_REPLAY),
        (Sent(12, 1, False), {"structured": True}, Plan.SYNTHESIZE_TOOL_USE),
        (Sent(0, 0, False), {"structured": True}, Plan.WHOLE_RESTART),
    ],
)
def test_plan_keeps_the_requests_budget_and_format(
    sent: Sent, options: dict[str, Any], plan: Plan
) -> None:
    assert plan_recovery(sent, **options) is plan

from __future__ import annotations

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

"""Recovery strategies, each alone: what a plan asks an upstream for, and when the answer
ends without one (``gateway.runs.strategies``)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.load import parse_config
from gateway.config.schema import Continuation
from gateway.protocols.chat import ChatAdapter
from gateway.recovery.plan import Plan
from gateway.runs.strategies import Need, strategy_for
from gateway.upstream.continuation import REPLAY
from gateway.upstream.routes import Router

ADAPTER = ChatAdapter()
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Go."}]}


def need(
    mode: Continuation, *, budget_left: int | None = None, body: dict[str, Any] = BODY
) -> Need:
    config = parse_config({"upstreams": [{"name": "u", "base_url": "http://u/v1"}]}, "test")
    sent = ADAPTER.new_accumulator()
    sent.add_text("The cat sat on the mat")
    route = Router(config).resolve("m")
    return Need(ADAPTER, body, mode, sent, route, budget_left)


def test_every_plan_has_its_strategy() -> None:
    assert {plan: strategy_for(plan).plan for plan in Plan} == {plan: plan for plan in Plan}


@pytest.mark.parametrize("plan", [Plan.WHOLE_RESTART, Plan.VERIFIED_REPLAY])
def test_a_restart_and_a_replay_ask_for_the_request_itself(plan: Plan) -> None:
    ask = strategy_for(plan).ask(need("vllm"))
    assert ask is not None and ask.body == BODY and not ask.prefill
    assert ask.seam is (REPLAY if plan is Plan.VERIFIED_REPLAY else None)


@pytest.mark.parametrize("plan", [Plan.CONTINUE_TEXT, Plan.TRUNCATE_BEFORE_TOOL])
def test_a_continuation_asks_for_what_is_left_of_the_budget(plan: Plan) -> None:
    ask = strategy_for(plan).ask(need("vllm", budget_left=7))
    assert ask is not None and ask.prefill and ask.seam is None  # literal: nothing to cut
    assert ask.body["messages"][-1] == {"role": "assistant", "content": "The cat sat on the mat"}
    assert "max_tokens" not in ask.body  # the client set no budget field: none is added
    limited = strategy_for(plan).ask(need("vllm", budget_left=7, body=BODY | {"max_tokens": 9}))
    assert limited is not None and limited.body["max_tokens"] == 7


def test_a_leg_set_to_replay_is_asked_for_the_request_verified() -> None:
    ask = strategy_for(Plan.CONTINUE_TEXT).ask(need("replay"))
    assert ask is not None and ask.body == BODY and ask.seam is REPLAY


def test_a_leg_that_cannot_continue_is_skipped() -> None:
    assert strategy_for(Plan.CONTINUE_TEXT).ask(need("none")) is None


def test_completed_calls_end_the_answer_even_after_a_refusal_a_spent_budget_does_not() -> None:
    splicer = ADAPTER.splicer(ADAPTER.new_accumulator(), BODY)
    assert strategy_for(Plan.FINISH_AT_BUDGET).end(splicer, fatal=True) is None
    assert b'"finish_reason":"length"' in (
        strategy_for(Plan.FINISH_AT_BUDGET).end(splicer, fatal=False) or b""
    )
    splicer = ADAPTER.splicer(ADAPTER.new_accumulator(), BODY)
    assert b"tool_calls" in (strategy_for(Plan.SYNTHESIZE_TOOL_USE).end(splicer, fatal=True) or b"")
    for plan in (Plan.WHOLE_RESTART, Plan.CONTINUE_TEXT, Plan.VERIFIED_REPLAY):
        assert strategy_for(plan).end(splicer, fatal=False) is None


def test_a_greedy_request_on_a_prompt_mode_leg_is_replayed_not_continued() -> None:
    greedy = BODY | {"temperature": 0}
    ask = strategy_for(Plan.CONTINUE_TEXT).ask(need("prompt", body=greedy))
    assert ask is not None and ask.body == greedy and ask.seam is REPLAY
    # Sampled, it is continued in prompt mode; greedy on a literal prefill, continued.
    sampled = strategy_for(Plan.CONTINUE_TEXT).ask(need("prompt", body=BODY | {"temperature": 1}))
    assert sampled is not None and sampled.body["messages"][-1]["role"] == "user"
    prefill = strategy_for(Plan.CONTINUE_TEXT).ask(need("vllm", body=greedy))
    assert prefill is not None and prefill.prefill

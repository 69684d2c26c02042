"""Estimating the usage of a leg that broke (pure)."""

from __future__ import annotations

from gateway.protocols.messages_items import MessagesAccumulator
from gateway.protocols.responses_items import ResponsesAccumulator
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.usage import LegMeasure, estimate_usage, output_spent, summed

CHAT = ("prompt_tokens", "completion_tokens", "total_tokens")
MESSAGES = ("input_tokens", "output_tokens")


def test_calibrated_on_the_legs_that_reported() -> None:
    broken = LegMeasure(request_bytes=400, output_chars=90, output_deltas=30, broke=True)
    reported = LegMeasure(request_bytes=500, output_chars=200, output_deltas=50)
    usage = {"prompt_tokens": 100, "completion_tokens": 100, "total_tokens": 200}
    # 2 tokens per delta and 0.2 per request byte, as the reporting leg showed.
    assert estimate_usage(broken, None, [(reported, usage)], CHAT) == {
        "prompt_tokens": 80,
        "completion_tokens": 60,
        "total_tokens": 140,
    }


def test_without_a_leg_that_reported_four_characters_or_bytes_a_token() -> None:
    broken = LegMeasure(request_bytes=400, output_chars=90, output_deltas=30, broke=True)
    assert estimate_usage(broken, None, [], CHAT) == {
        "prompt_tokens": 100,
        "completion_tokens": 22,
        "total_tokens": 122,
    }


def test_what_the_leg_reported_is_kept_and_never_lowered() -> None:
    # Messages: message_start said the input (and output 1) before the leg broke.
    broken = LegMeasure(request_bytes=400, output_chars=40, output_deltas=10, broke=True)
    usage = estimate_usage(broken, {"input_tokens": 11, "output_tokens": 1}, [], MESSAGES)
    assert usage == {"input_tokens": 11, "output_tokens": 10}
    # A report larger than the estimate (a usage chunk, then a reset) stands.
    usage = estimate_usage(broken, {"input_tokens": 11, "output_tokens": 50}, [], MESSAGES)
    assert usage == {"input_tokens": 11, "output_tokens": 50}


def test_a_leg_that_sent_and_received_nothing_has_no_estimate() -> None:
    assert estimate_usage(LegMeasure(broke=True), None, [], CHAT) is None


def test_the_accumulator_sums_reported_and_estimated_and_keeps_them_apart() -> None:
    accumulator = RunAccumulator()
    broken = accumulator.measure(0)
    broken.request_bytes, broken.output_chars, broken.output_deltas = 100, 40, 8
    broken.broke = True
    last = accumulator.measure(1)
    last.request_bytes, last.output_chars, last.output_deltas = 120, 60, 12
    accumulator.set_usage(1, {"prompt_tokens": 12, "completion_tokens": 12, "total_tokens": 24})
    accumulator.finish_reason = "stop"  # leg 1's usage is final: it calibrates
    assert accumulator.usage_by_leg == {1: accumulator.usage_by_leg[1]}  # reported only
    assert accumulator.estimated_by_leg == {
        0: {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}
    }
    assert accumulator.usage == {"prompt_tokens": 22, "completion_tokens": 20, "total_tokens": 42}


def test_a_leg_in_progress_does_not_calibrate_until_the_answer_finished() -> None:
    """Messages' message_start reports an output of 1 for the leg in progress: not a rate."""
    accumulator = RunAccumulator()
    accumulator.usage_counts = ("input_tokens", "output_tokens")
    broken = accumulator.measure(0)
    broken.request_bytes, broken.output_chars, broken.output_deltas = 100, 80, 20
    broken.broke = True
    accumulator.set_usage(0, {"input_tokens": 11, "output_tokens": 1})
    current = accumulator.measure(1)
    current.request_bytes, current.output_chars, current.output_deltas = 120, 200, 50
    accumulator.set_usage(1, {"input_tokens": 12, "output_tokens": 1})
    assert accumulator.estimated_by_leg[0]["output_tokens"] == 80 // 4  # not 20 * 1 / 50
    accumulator.set_usage(1, {"input_tokens": 12, "output_tokens": 50})
    accumulator.finish_reason = "end_turn"
    assert accumulator.estimated_by_leg[0]["output_tokens"] == 20  # 1 token a delta


# -- every field a provider reports, kept over legs -----------------------------------


def test_summed_keeps_every_field_nested_or_unknown() -> None:
    first = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 2},
        "service_tier": "default",
        "future": {"units": 1, "nested": {"deeper": 2}},
    }
    second = {
        "prompt_tokens": 12,
        "completion_tokens": 7,
        "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 6, "audio_tokens": 1},
        "completion_tokens_details": {"reasoning_tokens": 3},
        "service_tier": "priority",
        "future": {"units": 2, "nested": {"deeper": 5}, "flag": True},
    }
    assert summed([first, second], CHAT) == {
        "prompt_tokens": 22,
        "completion_tokens": 12,
        "total_tokens": 34,
        "prompt_tokens_details": {"cached_tokens": 10, "cache_write_tokens": 2, "audio_tokens": 1},
        "completion_tokens_details": {"reasoning_tokens": 3},
        "service_tier": "default",  # not a count: the first leg's
        "future": {"units": 3, "nested": {"deeper": 7}, "flag": True},  # a bool is no count
    }
    assert summed([], MESSAGES) == {"input_tokens": 0, "output_tokens": 0}


def test_a_recovered_answer_keeps_the_details_its_legs_reported() -> None:
    """Two legs that reported, one estimated: the client's usage has every field."""
    accumulator = RunAccumulator()
    broken = accumulator.measure(0)
    broken.request_bytes, broken.output_chars, broken.output_deltas = 100, 40, 8
    broken.broke = True
    details = {"cached_tokens": 3, "cache_write_tokens": 1, "future_tokens": 2}
    for leg in (1, 2):
        accumulator.measure(leg).request_bytes = 100
        accumulator.set_usage(
            leg,
            {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
            | {"prompt_tokens_details": details},
        )
    accumulator.finish_reason = "stop"
    usage = accumulator.usage
    assert usage is not None
    assert usage["prompt_tokens_details"] == {
        "cached_tokens": 6,
        "cache_write_tokens": 2,
        "future_tokens": 4,
    }
    assert (
        usage["completion_tokens"] == 5 + 5 + accumulator.estimated_by_leg[0]["completion_tokens"]
    )


def test_a_response_has_the_details_its_type_requires_when_no_leg_reported_them() -> None:
    """openai 3.57's ResponseUsage requires input_tokens_details.cache_write_tokens: an
    estimated or detail-less usage gets zeros; a reported one keeps what it said."""
    estimated = ResponsesAccumulator()
    measure = estimated.measure(0)
    measure.request_bytes, measure.output_chars, measure.broke = 80, 40, True
    usage = estimated.client_usage()
    assert usage["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    reported = ResponsesAccumulator()
    reported.set_usage(
        0,
        {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
        | {"input_tokens_details": {"cached_tokens": 1, "cache_write_tokens": 4, "x": 9}},
    )
    assert reported.client_usage()["input_tokens_details"] == {
        "cached_tokens": 1,
        "cache_write_tokens": 4,
        "x": 9,
    }
    assert reported.usage_by_leg[0]["input_tokens_details"] == {
        "cached_tokens": 1,
        "cache_write_tokens": 4,
        "x": 9,
    }  # the leg's own record is not touched


def test_messages_usage_keeps_cache_creation_and_server_tool_use_over_legs() -> None:
    accumulator = MessagesAccumulator()
    for leg in (0, 1):
        accumulator.measure(leg).request_bytes = 100
        accumulator.add_usage(
            leg,
            {
                "input_tokens": 10,
                "output_tokens": 4,
                "cache_creation_input_tokens": 1,
                "cache_read_input_tokens": 2,
                "cache_creation": {"ephemeral_5m_input_tokens": 1, "ephemeral_1h_input_tokens": 0},
                "server_tool_use": {"web_search_requests": 1},
                "service_tier": "standard",
            },
        )
    accumulator.finish_reason = "end_turn"
    assert accumulator.usage == {
        "input_tokens": 20,
        "output_tokens": 8,
        "cache_creation_input_tokens": 2,
        "cache_read_input_tokens": 4,
        "cache_creation": {"ephemeral_5m_input_tokens": 2, "ephemeral_1h_input_tokens": 0},
        "server_tool_use": {"web_search_requests": 2},
        "service_tier": "standard",
    }


def test_a_broken_legs_estimate_keeps_what_it_did_report() -> None:
    """Messages' message_start reports the input and its cache counts before it breaks:
    the estimate adds the output, and the cache counts stay in the client's usage."""
    accumulator = MessagesAccumulator()
    broken = accumulator.measure(0)
    broken.request_bytes, broken.output_chars, broken.output_deltas = 100, 40, 10
    broken.broke = True
    accumulator.add_usage(
        0,
        {
            "input_tokens": 11,
            "output_tokens": 1,
            "cache_read_input_tokens": 7,
            "cache_creation": {"ephemeral_5m_input_tokens": 3},
        },
    )
    accumulator.measure(1).request_bytes = 100
    accumulator.add_usage(1, {"input_tokens": 12, "output_tokens": 20})
    accumulator.finish_reason = "end_turn"
    usage = accumulator.usage
    assert usage is not None
    assert usage["cache_read_input_tokens"] == 7
    assert usage["cache_creation"] == {"ephemeral_5m_input_tokens": 3}
    assert usage["input_tokens"] == 23 and usage["output_tokens"] > 20


def test_the_output_spent_counts_what_legs_reported_else_a_token_a_delta() -> None:
    # Leg 0 broke after 12 deltas (nothing reported), leg 1 reported 30 tokens whole.
    broke, whole = LegMeasure(output_deltas=12, broke=True), LegMeasure(output_deltas=30)
    assert output_spent({0: broke}, {}, {}, "completion_tokens") == 12
    reported = {1: {"completion_tokens": 30}}
    assert output_spent({0: broke, 1: whole}, reported, {}, "completion_tokens") == 42


def test_the_output_spent_is_calibrated_by_the_runs_own_legs_and_floored_by_a_report() -> None:
    # A leg that reported 60 tokens for 30 deltas: two a delta for the one that broke.
    measures = {0: LegMeasure(output_deltas=30), 1: LegMeasure(output_deltas=5, broke=True)}
    reported: dict[int, dict[str, int]] = {0: {"output_tokens": 60}}
    assert output_spent(measures, reported, {}, "output_tokens") == 70
    # A broken leg's own running count (Messages) is a floor.
    reported[1] = {"output_tokens": 14}
    assert output_spent(measures, reported, {}, "output_tokens") == 74
    # Another replica's legs (a takeover) count what it estimated.
    restored = {0: {"output_tokens": 99}, 2: {"output_tokens": 3}}
    assert output_spent(measures, reported, restored, "output_tokens") == 77

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.config.schema import MinThroughput
from gateway.protocols.chat import delta_chars
from gateway.recovery.throughput import ThroughputGuard

MINIMUM = MinThroughput(chars_per_s=10, window=2, grace=3)


def feed(guard: ThroughputGuard, chars: int, every: float, until: float) -> float | None:
    """Feed ``chars`` every ``every`` seconds from t=0; the time it said slow, if it did."""
    steps = int(until / every)
    for step in range(1, steps + 1):
        if guard.add(chars, step * every):
            return step * every
    return None


def test_delta_chars_counts_content_reasoning_and_tool_arguments() -> None:
    chunk = {
        "choices": [
            {
                "delta": {
                    "content": "héllo",
                    "reasoning_content": "abc",
                    "tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}],
                }
            }
        ]
    }
    assert delta_chars(chunk) == 5 + 3 + 5
    assert delta_chars({"choices": [{"delta": {"reasoning": "xy"}}]}) == 2
    assert delta_chars({"choices": []}) == 0
    assert delta_chars({"usage": {"total_tokens": 3}}) == 0
    assert delta_chars({"choices": [{"delta": {"content": None, "tool_calls": [1]}}]}) == 0


def test_a_stream_at_the_minimum_is_never_slow() -> None:
    assert feed(ThroughputGuard(MINIMUM, 0.0), chars=1, every=0.1, until=60) is None


def test_a_crawl_is_slow_once_grace_has_passed_and_not_before() -> None:
    slow_at = feed(ThroughputGuard(MINIMUM, 0.0), chars=1, every=0.2, until=60)
    assert slow_at is not None and MINIMUM.grace <= slow_at < MINIMUM.grace + 1


def test_the_window_slides_a_fast_start_does_not_excuse_a_later_crawl() -> None:
    guard = ThroughputGuard(MINIMUM, 0.0)
    assert feed(guard, chars=100, every=0.1, until=10) is None
    slowed = None
    for step in range(1, 100):
        now = 10 + step * 0.5
        if guard.add(1, now):
            slowed = now
            break
    # The last window no longer holds the fast start: slow within about a window.
    assert slowed is not None and slowed <= 10 + MINIMUM.window * 1.5


def test_a_grace_shorter_than_the_window_waits_for_a_window_of_history() -> None:
    guard = ThroughputGuard(MinThroughput(chars_per_s=10, window=2, grace=0), 0.0)
    assert not guard.add(0, 0.01)
    assert not guard.add(0, 1.9)
    assert not guard.add(0, 2.1)  # checked a quarter window apart at most: not yet
    assert guard.add(0, 2.5)


@given(
    rate=st.floats(min_value=10, max_value=1000),
    gaps=st.lists(st.floats(min_value=0.001, max_value=0.5), min_size=1, max_size=300),
)
def test_never_slow_while_every_window_holds_the_minimum(rate: float, gaps: list[float]) -> None:
    guard = ThroughputGuard(MINIMUM, 0.0)
    now = 0.0
    for gap in gaps:
        # Characters arrive ahead of the minimum: the gap's share, rounded up, and one more.
        now += gap
        assert not guard.add(int(rate * gap) + 1, now)


def test_a_pause_longer_than_the_window_is_not_slowness() -> None:
    """Silence is the idle timeout's; a client that stops reading pauses the relay."""
    guard = ThroughputGuard(MinThroughput(chars_per_s=10, window=4, grace=0), start=0.0)
    t = 0.0
    while t < 12:  # 100 chars/s for 12 s
        assert not guard.add(10, t)
        t += 0.1
    t += 8  # an 8 s pause, then full speed again
    for _ in range(50):
        assert not guard.add(10, t)
        t += 0.1

"""The circuit breaker's state machine, on a hand-driven clock (pure: no sockets)."""

from __future__ import annotations

import pytest

from gateway.config.load import parse_config
from gateway.config.schema import Circuit, ConfigError
from gateway.upstream.breaker import CircuitBreaker, CircuitBreakers, CircuitState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def breaker(
    clock: Clock, changes: list[CircuitState] | None = None, **policy: float
) -> CircuitBreaker:
    def changed(name: str, state: CircuitState) -> None:
        assert name == "up"
        if changes is not None:
            changes.append(state)

    return CircuitBreaker(
        "up",
        Circuit.model_validate({"failures": 3, "cooldown": 10} | policy),
        clock=clock,
        on_change=changed,
    )


def test_failures_in_a_row_open_the_circuit_and_it_refuses_during_the_cooldown(
    clock: Clock,
) -> None:
    changes: list[CircuitState] = []
    circuit = breaker(clock, changes)
    for _ in range(2):
        circuit.failed()
        assert circuit.allows() and circuit.state is CircuitState.CLOSED
    circuit.failed()
    assert circuit.state is CircuitState.OPEN and changes == [CircuitState.OPEN]
    clock.now += 9.9
    assert not circuit.allows()


def test_a_success_resets_the_count(clock: Clock) -> None:
    circuit = breaker(clock)
    for _ in range(5):
        circuit.failed()
        circuit.failed()
        circuit.succeeded()
    assert circuit.state is CircuitState.CLOSED and circuit.allows()


def test_after_the_cooldown_one_probe_goes_through_and_its_success_closes(
    clock: Clock,
) -> None:
    changes: list[CircuitState] = []
    circuit = breaker(clock, changes)
    for _ in range(3):
        circuit.failed()
    clock.now += 10
    assert circuit.allows()  # the probe
    assert circuit.state is CircuitState.HALF_OPEN
    assert not circuit.allows() and not circuit.allows()  # one probe at a time
    circuit.succeeded()
    assert circuit.allows() and circuit.allows()
    assert changes == [CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED]
    circuit.failed()  # counting starts afresh
    circuit.failed()
    assert changes == [CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED]


def test_a_failed_probe_reopens_for_another_cooldown(clock: Clock) -> None:
    changes: list[CircuitState] = []
    circuit = breaker(clock, changes)
    for _ in range(3):
        circuit.failed()
    clock.now += 10
    assert circuit.allows()
    circuit.failed()
    assert circuit.state is CircuitState.OPEN
    clock.now += 9.9
    assert not circuit.allows()
    clock.now += 0.1
    assert circuit.allows()
    assert changes == [CircuitState.OPEN, CircuitState.HALF_OPEN] * 2


def test_a_probe_that_never_reports_frees_its_slot_after_a_cooldown(clock: Clock) -> None:
    circuit = breaker(clock)
    for _ in range(3):
        circuit.failed()
    clock.now += 10
    assert circuit.allows()  # its client left: no success, no failure
    clock.now += 9.9
    assert not circuit.allows()
    clock.now += 0.1
    assert circuit.allows() and circuit.state is CircuitState.HALF_OPEN


def test_failures_while_open_do_not_extend_the_cooldown(clock: Clock) -> None:
    circuit = breaker(clock)
    for _ in range(3):
        circuit.failed()
    clock.now += 5
    circuit.failed()  # a request that started before it opened
    clock.now += 5
    assert circuit.allows()


def test_a_success_while_open_closes_it(clock: Clock) -> None:
    circuit = breaker(clock)
    for _ in range(3):
        circuit.failed()
    circuit.succeeded()  # a last leg tried anyway answered
    assert circuit.state is CircuitState.CLOSED and circuit.allows()


def test_zero_failures_disables_it(clock: Clock) -> None:
    changes: list[CircuitState] = []
    circuit = breaker(clock, changes, failures=0)
    for _ in range(100):
        circuit.failed()
    assert circuit.allows() and changes == []


def test_each_upstream_has_its_own_breaker_from_its_config() -> None:
    config = parse_config(
        {
            "upstreams": [
                {"name": "a", "base_url": "http://a", "circuit": {"failures": 1}},
                {"name": "b", "base_url": "http://b"},
            ]
        }
    )
    assert config.upstream("b").circuit == Circuit(failures=5, cooldown=30)
    breakers = CircuitBreakers(config.upstreams)
    breakers["a"].failed()
    assert not breakers["a"].allows() and breakers["b"].allows()


def test_a_bad_circuit_config_names_the_key() -> None:
    upstream = {"name": "a", "base_url": "http://a", "circuit": {"cooldown": 0}}
    with pytest.raises(ConfigError, match=r"upstreams\.0\.circuit\.cooldown"):
        parse_config({"upstreams": [upstream]})

"""Circuit breaking per upstream: an upstream that keeps failing is skipped for a while.

One state machine per upstream, shared by every run of the process::

    closed ── `failures` failures in a row ──► open ── `cooldown` passed ──► half_open
      ▲                                          ▲                             │
      │                                          └──── the probe fails ────────┤
      └─────────────────────── a success (the probe's, or any other) ──────────┘

While open, runs skip the upstream's legs (``runs/run.py`` decides what a skip means: the
last leg of a route is tried anyway). Half-open lets one request through as a probe;
a probe that never reports (its client left mid-way, a 429) frees the slot after
another ``cooldown``, so a lost probe cannot keep the upstream out for good.

Pure: the clock is injected, nothing here sleeps or does I/O. Per process by
design (docs/recovery.md): each worker and replica learns on its own.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable

from gateway.config.schema import Circuit, Upstream


class CircuitState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# Called on every change of state: the upstream's name and its new state.
OnChange = Callable[[str, CircuitState], None]


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        policy: Circuit,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: OnChange | None = None,
    ) -> None:
        self.name = name
        self._threshold = policy.failures  # 0: never opens
        self._cooldown = policy.cooldown
        self._clock = clock
        self._on_change = on_change
        self.state = CircuitState.CLOSED
        self._failures = 0  # in a row, while closed
        self._until = 0.0  # open: when the cool-down ends; half-open: when the probe lapses

    def allows(self) -> bool:
        """Whether a request may go to the upstream now. In half-open, a True claims
        the one probe: the caller must send it, and report how it went."""
        if self.state is CircuitState.CLOSED:
            return True
        now = self._clock()
        if now < self._until:
            return False
        self._until = now + self._cooldown  # the probe's slot lapses after another cool-down
        self._set(CircuitState.HALF_OPEN)
        return True

    def succeeded(self) -> None:
        self._failures = 0
        self._set(CircuitState.CLOSED)

    def failed(self) -> None:
        if self._threshold == 0:
            return
        if self.state is CircuitState.CLOSED:
            self._failures += 1
            if self._failures < self._threshold:
                return
        elif self.state is CircuitState.OPEN:
            return  # a request that started before it opened, or a last leg tried anyway
        self._failures = 0
        self._until = self._clock() + self._cooldown
        self._set(CircuitState.OPEN)

    def _set(self, state: CircuitState) -> None:
        if state is not self.state:
            self.state = state
            if self._on_change is not None:
                self._on_change(self.name, state)


class CircuitBreakers:
    """The breakers of every configured upstream, by name."""

    def __init__(
        self,
        upstreams: Iterable[Upstream],
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: OnChange | None = None,
    ) -> None:
        self._breakers = {
            u.name: CircuitBreaker(u.name, u.circuit, clock=clock, on_change=on_change)
            for u in upstreams
        }

    def __getitem__(self, upstream: str) -> CircuitBreaker:
        return self._breakers[upstream]

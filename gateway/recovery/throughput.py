"""The slow-stream check: is a leg streaming below its route's minimum throughput?

Pure, like the rest of recovery: the caller passes the clock. Per chunk it costs an
addition and one comparison with a deadline; only every quarter window is a sample
kept and the rate over the last window worked out. No timer is armed: a stream
that goes quiet is the idle timeout's business, so a check that runs when a chunk
arrives is enough.
"""

from __future__ import annotations

from collections import deque

from gateway.config.schema import MinThroughput

_STEPS = 4  # samples per window: the window slides by a quarter of its length


class ThroughputGuard:
    """Counts one leg's characters from its first event (``start``); ``add`` says when the
    rate over the last ``window`` seconds is below the minimum, once ``grace`` (and at
    least one window) has passed.

    The rate is taken since the newest sample at least a window old (the first event,
    early on): over a window, plus up to a quarter of one.
    """

    __slots__ = ("_chars", "_check_from", "_minimum", "_next", "_samples", "_step", "_window")

    def __init__(self, minimum: MinThroughput, start: float) -> None:
        self._minimum = minimum.chars_per_s
        self._window = minimum.window
        self._step = minimum.window / _STEPS
        # A rate needs a window of history: the first check is after the longer of the two.
        self._check_from = start + max(minimum.grace, minimum.window)
        self._chars = 0
        self._samples: deque[tuple[float, int]] = deque([(start, 0)])
        self._next = start + self._step

    def add(self, chars: int, now: float) -> bool:
        """Count ``chars`` arrived at ``now``; True if the leg is too slow."""
        self._chars += chars
        if now < self._next:
            return False
        return self._sample(now)

    def _sample(self, now: float) -> bool:
        samples = self._samples
        if now - samples[-1][0] > self._window:
            # A pause longer than the window: silence is the idle timeout's business, and a
            # client that does not read holds the relay back (back-pressure). Neither says
            # the upstream is slow: measure afresh from here.
            samples.clear()
            samples.append((now, self._chars))
            self._next = now + self._step
            self._check_from = max(self._check_from, now + self._window)
            return False
        samples.append((now, self._chars))
        self._next = now + self._step
        horizon = now - self._window
        while len(samples) > 1 and samples[1][0] <= horizon:
            samples.popleft()  # bounded: samples are a step apart, none older than a window
        if now < self._check_from:
            return False
        since, chars = samples[0]  # at least a window old
        return (self._chars - chars) < self._minimum * (now - since)

"""The seam: where a continuation's text joins what the client already has.

A guess at the seam loses or doubles text whenever an answer repeats itself
("… papa" | "papa sierra", a line of ``}`` after another, a run of spaces): no
rule can tell an echo of the last words from a genuine repeat by looking at the
text. So the seam is trimmed only by what the continuation request makes known
(``SeamRule``, built with the request in ``gateway.upstream.continuation``):

- ``vllm`` and ``prefix`` upstreams continue literally: no rule, nothing trimmed.
- ``prefix_echo`` upstreams (Mistral) repeat the whole prefix first: exactly that
  is cut.
- ``prompt`` upstreams are asked to begin their reply with a quoted anchor, the
  last words of the text (``anchor_tail``): a reply that begins with it loses
  exactly the anchor (leading whitespace before it tolerated, and cut too). A reply
  that begins with everything the client has is a restart from the beginning,
  whatever its length, and loses exactly that. Any other reply did not do as asked
  and is never shown (``verify``): the trimmer says ``diverged`` and the run tries
  another way (a verified replay) or ends with the explicit error (ARCHITECTURE.md
  6b, rule 1). The residual risk — a model that ignores the anchor yet happens to
  begin with it — is measured in BENCHMARKS.md ("Seam").
- a **verified replay** (the same request again, for an answer a continuation cannot
  extend: structured output, a prompt-mode reply that did not follow) must begin
  with everything the client has: that is cut, anything else is ``diverged``.

While the reply could still be the anchor or a restart, it is held, so the seam
costs the anchor's length in latency (a few deltas), and a restart is held until
it has repeated everything or diverged.
"""

from __future__ import annotations

from dataclasses import dataclass

ANCHOR_MAX = 40  # characters quoted back to a prompt-mode model
ANCHOR_MIN = 16  # ... at least, when the anchor is moved forward to a word's start


def anchor_tail(text: str) -> str:
    """The last words of ``text``, for a continuation to repeat before it goes on.

    At most ``ANCHOR_MAX`` characters, starting at a word where one starts in the
    first part of that window: models copy whole words more faithfully.
    """
    if len(text) <= ANCHOR_MAX:
        return text
    tail = text[-ANCHOR_MAX:]
    for start in range(1, ANCHOR_MAX - ANCHOR_MIN + 1):
        if tail[start - 1].isspace() and not tail[start].isspace():
            return tail[start:]
    return tail


@dataclass(frozen=True, slots=True)
class SeamRule:
    """What a continuation is known to repeat before the new text."""

    echo: str | None  # the exact text it begins with (the anchor, or the whole prefix)
    restart: bool  # a reply that begins with the whole prefix is a restart
    # A reply that is neither the echo nor a restart did not do as asked: never shown.
    verify: bool = False


class SeamDiverged(Exception):
    """A verified seam's reply began with neither what it was asked to repeat nor the
    whole answer so far: nothing of it reached the client (``Run`` tries another way)."""


class SeamTrimmer:
    """Holds a continuation's first characters until ``rule`` says what to cut."""

    def __init__(self, sent: str, rule: SeamRule) -> None:
        self._sent = sent
        self._echo = rule.echo or None
        self._restart = rule.restart
        self._verify = rule.verify
        self._pending = ""
        self.trimmed = 0  # characters cut
        # "echo", "restart", "none" or "diverged" (not shown), once decided
        self.outcome: str | None = None
        self.done = not sent

    def feed(self, text: str) -> str:
        """Text to release now ("" while holding)."""
        if self.done:
            return text
        pending = self._pending + text
        cut = self._cut(pending, final=False)
        if cut is None:
            self._pending = pending
            return ""
        return self._decide(pending, cut)

    def flush(self) -> str:
        """The continuation finished: decide with what arrived."""
        if self.done:
            return ""
        pending = self._pending
        return self._decide(pending, self._cut(pending, final=True) or ("none", 0))

    def discard(self) -> None:
        """The continuation broke: what it held was never sent, the next one starts over."""
        self._pending = ""

    def _cut(self, pending: str, *, final: bool) -> tuple[str, int] | None:
        """(outcome, characters to cut), or None while it cannot be known yet."""
        echo, sent = self._echo, self._sent
        if echo is not None:
            # A verified reply may put whitespace before the anchor (a newline after
            # the instruction): certainly harmless, and cut with it. Nothing else is.
            lead = 0
            if self._verify and not echo[0].isspace():
                lead = len(pending) - len(pending.lstrip())
                if lead == len(pending) and not final:
                    return None  # whitespace only so far
            if pending.startswith(echo, lead):
                return "echo", lead + len(echo)
            if not final and echo.startswith(pending[lead:]):
                return None
        if self._restart:
            if pending.startswith(sent):
                return "restart", len(sent)
            if not final and sent.startswith(pending):
                return None
        if self._verify:
            self.outcome, self.done, self._pending = "diverged", True, ""
            raise SeamDiverged(pending[:80])
        return "none", 0

    def _decide(self, pending: str, cut: tuple[str, int]) -> str:
        self.outcome, self.trimmed = cut
        self.done = True
        self._pending = ""
        return pending[self.trimmed :]


class Seams:
    """The seams of one run, leg after leg: the current one's trimmer, and what the
    earlier ones cut (for metrics). Shared by every protocol's splicer."""

    def __init__(self) -> None:
        self.current: SeamTrimmer | None = None
        self._trimmed_earlier = 0
        self._outcomes: list[str] = []

    def next_leg(self, sent: str, rule: SeamRule | None) -> SeamTrimmer | None:
        """A new leg: ``rule`` says what it repeats first of ``sent`` (None: nothing)."""
        if self.current is not None:
            self._trimmed_earlier += self.current.trimmed
            if self.current.outcome is not None:
                self._outcomes.append(self.current.outcome)
        self.current = SeamTrimmer(sent, rule) if rule is not None else None
        return self.current

    @property
    def trimmed(self) -> int:
        """Characters trimmed at every seam of the run so far."""
        return self._trimmed_earlier + (self.current.trimmed if self.current is not None else 0)

    def outcomes(self) -> list[str]:
        """What each decided seam of the run cut ("echo", "restart", "none")."""
        current = self.current.outcome if self.current is not None else None
        return self._outcomes + ([current] if current is not None else [])

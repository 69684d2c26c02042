"""What a recovery strategy is asked, and what it answers (``gateway.runs.strategies``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.config.schema import Continuation
from gateway.protocols.base import Adapter, ClientStream
from gateway.recovery.accumulator import RunAccumulator
from gateway.recovery.plan import Plan
from gateway.recovery.seam import SeamRule
from gateway.upstream.routes import ResolvedRoute


@dataclass(frozen=True, slots=True)
class Need:
    """What a strategy decides a leg's request from."""

    adapter: Adapter
    body: dict[str, Any]  # the client's request, as this leg's model takes it
    mode: Continuation  # how this leg continues an answer (learned, or refused: prompt)
    sent: RunAccumulator  # what the client has
    route: ResolvedRoute  # its continuation prompt and anchor
    budget_left: int | None  # output tokens the client's request still allows


@dataclass(frozen=True, slots=True)
class Ask:
    """One upstream request of a run."""

    body: dict[str, Any]
    seam: SeamRule | None = None  # what its answer repeats first (None: nothing)
    # It ends with an assistant message for the model to go on (a prefill): a 4xx
    # answer to it may be the model refusing that, never to any other request.
    prefill: bool = False


class Strategy:
    """One plan, carried out. Immutable, shared by every run."""

    plan: ClassVar[Plan]

    def end(self, stream: ClientStream, *, fatal: bool) -> bytes | None:
        """The end of the answer, without an upstream call; None: ``ask`` an upstream.
        ``fatal``: the break was a refusal, which only an answer already whole outranks."""
        return None

    def ask(self, need: Need) -> Ask | None:
        """This leg's request (None: the leg cannot serve it, the next one is tried)."""
        return Ask(need.body)

"""VerifiedReplay: the client's request again, with its whole budget, held until it has
repeated everything the client has; then that is cut and the rest flows. Anything else
is never shown (``SeamDiverged``) and, a replay being the last resort, ends the answer
with the explicit error. Exact on a deterministic upstream (greedy decoding); it costs the
text again, in tokens and in the time the replay takes to catch up.

For what a continuation cannot extend exactly (a document in a schema: a prompt-mode
reply opens a new one, a server's grammar does not carry the prefix's state), after a
continuation that did not do as asked, and on legs set to ``continuation: replay``."""

from __future__ import annotations

from gateway.recovery.plan import Plan
from gateway.runs.strategies.base import Ask, Need, Strategy
from gateway.upstream.continuation import REPLAY


class VerifiedReplay(Strategy):
    plan = Plan.VERIFIED_REPLAY

    def ask(self, need: Need) -> Ask:
        return Ask(need.body, REPLAY)

"""ContinueText and TruncateBeforeTool: the text the client has, continued by the leg's
own means (``gateway.upstream.continuation``: a literal prefill, a prefix, or prompt mode
with a quoted anchor), asking for what is left of the client's output budget
(ARCHITECTURE.md 6b, rule 4). A greedy request (``temperature: 0``) on a prompt-mode leg
is replayed and verified instead: it asks for the model's one answer, which prompt mode
cannot give. A half-written tool call was never sent: it is dropped, and
the model may emit it again, whole."""

from __future__ import annotations

from gateway.recovery.plan import Plan
from gateway.runs.strategies.base import Ask, Need, Strategy
from gateway.runs.strategies.replay import VerifiedReplay
from gateway.upstream.continuation import Continuing


class ContinueText(Strategy):
    plan = Plan.CONTINUE_TEXT

    def ask(self, need: Need) -> Ask | None:
        if need.mode == "replay":  # a leg set to continue by replaying the request
            return VerifiedReplay().ask(need)
        if need.mode == "prompt" and need.adapter.greedy(need.body):
            # A greedy request asks for the model's one answer; a prompt-mode reply, even
            # one that does as asked, is another (the model was asked something else).
            return VerifiedReplay().ask(need)
        route = need.route
        how = Continuing(need.mode, route.continuation_prompt, route.continuation_anchor)
        continued = need.adapter.continuation(need.body, need.sent, how)
        if continued is None:
            return None
        body = continued.body
        if need.budget_left is not None:  # > 0: a spent budget finished the answer instead
            body = need.adapter.with_budget(body, need.budget_left)
        return Ask(body, continued.seam, continued.prefill)


class TruncateBeforeTool(ContinueText):
    """Text and a half-written call: the call is dropped (it was never sent), the text
    continued as ``ContinueText`` does."""

    plan = Plan.TRUNCATE_BEFORE_TOOL

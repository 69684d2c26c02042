"""Reattach: the leg's own upstream response read again from where it broke, on the same
upstream: the provider's generation went on without a reader (an OpenAI or Azure
background response), so the answer is the unbroken one, with no new generation and no
seam. ``GET /responses/{id}?stream=true&starting_after=N``, N the last event received;
its events go on in the same leg of the splicer.

Chosen before every other plan for a break of the connection (reset, close, truncation,
an HTTP/2 reset, an idle stall) of a leg whose response says ``background: true``; once
per break while the reads make progress. If the upstream cannot (404: expired or not
found; the response failed, was cancelled or ended), the usual plans run, and a response
left generating is cancelled (nobody would read it).
"""

from __future__ import annotations

from gateway.recovery.plan import Plan
from gateway.runs.strategies.base import Ask, Need, Strategy


class Reattach(Strategy):
    plan = Plan.REATTACH  # the run reads the leg again itself (``Run._read_again``)

    def ask(self, need: Need) -> Ask | None:
        return None  # no request body: the leg's response is read again

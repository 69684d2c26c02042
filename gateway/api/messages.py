"""The Anthropic Messages API: ``POST /v1/messages`` (ARCHITECTURE.md section 2a).

A run like a chat completion (streamed or assembled, recovered the same way) on the
legs of its route whose upstream serves the Messages API (``kind: anthropic``, or
``protocols: [messages]``). ``x-run-id`` + ``x-resume-from`` resume it as they do a
chat completion; so does ``GET /v1/runs/{id}/events``. Errors from the gateway
itself are Anthropic-shaped here; an upstream's own pass through unchanged.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.answer import answer, asked
from gateway.protocols import MESSAGES


async def create_message(request: Request) -> Response:
    new = await asked(request, MESSAGES)
    if isinstance(new, Response):
        return new  # a resume
    return await answer(request, new)

"""POST /v1/chat/completions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.answer import answer, asked
from gateway.api.passthrough import forward_json
from gateway.protocols import CHAT


async def chat_completions(request: Request) -> Response:
    new = await asked(request, CHAT)
    if isinstance(new, Response):
        return new  # a resume
    if new.body.get("n") not in (None, 1):
        # Several choices: relayed as they are, without splicing (so without recovery).
        leg = new.route.legs[0]
        return await forward_json(request, new.gateway, leg, new.body, new.client_authorization)
    return await answer(request, new)

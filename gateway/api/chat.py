"""POST /v1/chat/completions."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.answer import answer
from gateway.api.fields import apply_fallbacks, without_gateway_fields
from gateway.api.passthrough import forward_json
from gateway.api.runs import resume_stream
from gateway.context import gateway_of
from gateway.observe import request_log
from gateway.protocols import CHAT


async def chat_completions(request: Request) -> Response:
    started = time.perf_counter()
    gateway = gateway_of(request)
    client_authorization = gateway.auth.authorize(request)
    resumed = request.headers.get("x-run-id")
    if resumed is not None:
        return await resume_stream(request, gateway, resumed)
    body = await gateway.read_json(request)
    route = gateway.router.resolve(body.get("model"))
    request_log().route = route.name
    route = apply_fallbacks(route, body.get("fallbacks"), gateway.router).serving(CHAT.name)
    body = without_gateway_fields(body)  # a strict upstream refuses fields it does not know
    if body.get("n") not in (None, 1):
        # Several choices: relayed as they are, without splicing (so without recovery).
        return await forward_json(request, gateway, route.legs[0], body, client_authorization)
    return await answer(request, gateway, CHAT, route, body, client_authorization, started)

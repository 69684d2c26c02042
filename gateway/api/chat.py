"""POST /v1/chat/completions."""

from __future__ import annotations

import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.passthrough import forward_json, upstream_error_response
from gateway.api.runs import RunStream, resume_chat
from gateway.context import gateway_of
from gateway.errors import GatewayError
from gateway.observe import request_log
from gateway.run import ChatRun
from gateway.upstream.client import UpstreamHTTPError


async def chat_completions(request: Request) -> Response:
    started = time.perf_counter()
    gateway = gateway_of(request)
    client_authorization = gateway.auth.authorize(request)
    resumed = request.headers.get("x-run-id")
    if resumed is not None:
        return await resume_chat(request, gateway, resumed)
    body = await gateway.read_json(request)
    route = gateway.router.resolve(body.get("model"))
    log = request_log()
    log.route = route.name
    if body.get("n") not in (None, 1):
        # Several choices: relayed as they are, without splicing (so without recovery).
        return await forward_json(request, gateway, route.legs[0], body, client_authorization)

    run = ChatRun(
        route=route,
        body=body,
        client_authorization=client_authorization,
        upstreams=gateway.upstreams,
        metrics=gateway.metrics,
        started=started,
    )
    log.run = run
    headers = {"x-run-id": run.id}
    try:
        if run.stream:
            with gateway.runs.in_progress():
                await run.open()
                # Relayed by its own task: the run outlives this connection (detach).
                local = gateway.runs.adopt(run, request.headers.get("authorization"))
            return RunStream(local.attach(0, ids=False), headers)
        await run.open()
        completion = await run.collect()
    except UpstreamHTTPError as exc:
        # The upstream's own 4xx/5xx before any stream: passed through unchanged.
        return upstream_error_response(exc.status_code, exc.headers, exc.content, **headers)
    except GatewayError as exc:
        response = exc.response()
        response.headers.update(headers)
        return response
    return Response(orjson.dumps(completion), media_type="application/json", headers=headers)

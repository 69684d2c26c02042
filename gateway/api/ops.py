"""Health, readiness and metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.context import Gateway, gateway_of


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    reason = await _readiness(gateway_of(request))
    if reason is None:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)


async def metrics(request: Request) -> Response:
    gateway = gateway_of(request)
    await _readiness(gateway)  # gateway_ready as of this scrape
    body, content_type = gateway.metrics.render()
    return Response(body, media_type=content_type)


async def _readiness(gateway: Gateway) -> str | None:
    reason = await gateway.not_ready_reason()
    gateway.metrics.ready.set(reason is None)
    return reason

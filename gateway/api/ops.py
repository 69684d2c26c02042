"""Health, readiness and metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.context import gateway_of


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    reason = await gateway_of(request).not_ready_reason()
    if reason is None:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)


async def metrics(request: Request) -> Response:
    body, content_type = gateway_of(request).metrics.render()
    return Response(body, media_type=content_type)

"""The objects one app owns for its lifetime: created in the lifespan, closed there."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as redis
from starlette.requests import Request

from gateway.api.inbound import ClientAuth, read_body, read_json_object
from gateway.config import GatewayConfig
from gateway.metrics import Metrics
from gateway.upstream.client import UpstreamClient
from gateway.upstream.routes import Router


class Gateway:
    def __init__(self, config: GatewayConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.router = Router(config)
        self.metrics = metrics if metrics is not None else Metrics()
        self.auth = ClientAuth([k.get_secret_value().encode() for k in config.auth.keys])
        self.upstreams = UpstreamClient(config.upstreams, config.limits)
        redis_url = config.state.redis_url
        self.redis: redis.Redis | None = (
            redis.from_url(redis_url.get_secret_value()) if redis_url else None
        )

    async def read_json(self, request: Request) -> dict[str, Any]:
        return await read_json_object(request, self.config.limits.max_body_bytes)

    async def read_body(self, request: Request) -> bytes:
        return await read_body(request, self.config.limits.max_body_bytes)

    def count(self, route: str, method: str, status: int) -> None:
        self.metrics.requests.labels(route, method, str(status)).inc()

    async def not_ready_reason(self) -> str | None:
        """Why this replica should not get traffic, or None when it is ready."""
        if self.redis is not None:
            try:
                async with asyncio.timeout(1.0):
                    await self.redis.ping()
            except (TimeoutError, OSError, redis.RedisError) as exc:
                return f"redis unreachable: {type(exc).__name__}"
        return None

    async def aclose(self) -> None:
        await self.upstreams.aclose()
        if self.redis is not None:
            await self.redis.aclose()


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway

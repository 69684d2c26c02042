"""The objects one app owns for its lifetime: created in the lifespan, closed there."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from gateway.api.inbound import ClientAuth, read_body, read_json_object
from gateway.checkpoint.redis import RedisStore
from gateway.checkpoint.store import CheckpointStore, MemoryStore
from gateway.config import GatewayConfig, State
from gateway.metrics import Metrics
from gateway.resume import Runs
from gateway.upstream.client import UpstreamClient
from gateway.upstream.routes import Router


class Gateway:
    def __init__(self, config: GatewayConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.router = Router(config)
        self.metrics = metrics if metrics is not None else Metrics()
        self.auth = ClientAuth([k.get_secret_value().encode() for k in config.auth.keys])
        self.upstreams = UpstreamClient(config.upstreams, config.limits)
        self.store = make_store(config.state)
        self.runs = Runs(
            config.state,
            self.store,
            metrics=self.metrics,
            router=self.router,
            upstreams=self.upstreams,
        )
        self.draining = False
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.runs.start()

    def begin_drain(self) -> None:
        """SIGTERM: report not ready, let streams finish up to the drain timeout, then
        checkpoint the rest and end their clients' streams with a resumable error."""
        if self._drain is None:
            self.draining = True
            timeout = self.config.listen.drain_timeout
            self._drain = asyncio.get_running_loop().create_task(self.runs.drain(timeout))

    async def read_json(self, request: Request) -> dict[str, Any]:
        return await read_json_object(request, self.config.limits.max_body_bytes)

    async def read_body(self, request: Request) -> bytes:
        return await read_body(request, self.config.limits.max_body_bytes)

    async def not_ready_reason(self) -> str | None:
        """Why this replica should not get traffic, or None when it is ready."""
        if self.draining:
            return "draining: the gateway is shutting down"
        if isinstance(self.store, RedisStore):
            try:
                async with asyncio.timeout(1.0):
                    await self.store.ping()
            except Exception as exc:  # noqa: BLE001 - any failure means not ready
                return f"redis unreachable: {type(exc).__name__}"
        return None

    async def aclose(self) -> None:
        try:
            if self._drain is not None:
                await self._drain
        finally:
            await self.runs.aclose()  # runs first: their last checkpoints need the store
            await self.upstreams.aclose()


def make_store(config: State) -> CheckpointStore | None:
    backend = config.backend
    if backend == "redis":
        assert config.redis_url is not None
        return RedisStore(config.redis_url.get_secret_value(), config.pool_size)
    return MemoryStore() if backend == "memory" else None


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway

"""The objects one app owns for its lifetime: created in the lifespan, closed there."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection, Request

from gateway.checkpoint.redis import RedisStore
from gateway.checkpoint.store import CheckpointStore, MemoryStore
from gateway.config.schema import GatewayConfig, State
from gateway.inbound import ClientAuth, read_body, read_json_object
from gateway.metrics import Metrics
from gateway.otel_env import tracing_enabled
from gateway.runs.registry import Runs
from gateway.runs.resume import Resumes
from gateway.upstream.breaker import CircuitState
from gateway.upstream.client import UpstreamClient
from gateway.upstream.routes import Router

if TYPE_CHECKING:
    from gateway.tracing import Tracing

logger = logging.getLogger("gateway.circuit")

# Seconds /readyz waits for Redis: a dead or frozen Redis reads as not ready well
# within the 1 s a Kubernetes probe waits by default.
STORE_CHECK_TIMEOUT = 0.5


class Gateway:
    def __init__(self, config: GatewayConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.router = Router(config)
        self.metrics = metrics if metrics is not None else Metrics()
        self.auth = ClientAuth([k.get_secret_value().encode() for k in config.auth.keys])
        self.upstreams = UpstreamClient(
            config.upstreams, config.limits, on_circuit_change=self._circuit_changed
        )
        self.store = make_store(config.state)
        self.runs = Runs(
            config.state,
            self.store,
            metrics=self.metrics,
            max_client_lag=config.limits.max_client_lag_bytes,
        )
        self.resumes = Resumes(self.runs, self.router)
        self.tracing: Tracing | None = None  # started with the app (one per worker)
        self.draining = False
        self.open_sockets = 0  # Responses API WebSockets (api/responses_ws.py)
        self._drain: asyncio.Task[None] | None = None
        self._store_check: asyncio.Task[str | None] | None = None
        for upstream in config.upstreams:  # every circuit starts closed, and says so
            self.metrics.circuit_open.labels(upstream.name).set(0)

    async def start(self) -> None:
        self.runs.start()
        if tracing_enabled(self.config.tracing, os.environ):
            from gateway.tracing import Tracing  # the SDK, imported only when it is on

            self.tracing = self.resumes.tracing = Tracing(self.config.tracing, os.environ)

    def _circuit_changed(self, upstream: str, state: CircuitState) -> None:
        self.metrics.circuit_transitions.labels(upstream, state.value).inc()
        self.metrics.circuit_open.labels(upstream).set(state is not CircuitState.CLOSED)
        # One line when it opens (again, after a failed probe) and when it closes.
        if state is CircuitState.OPEN:
            cooldown = self.config.upstream(upstream).circuit.cooldown
            logger.warning(
                "circuit open",
                extra={"upstream": upstream, "cooldown_s": cooldown},
            )
        elif state is CircuitState.CLOSED:
            logger.info("circuit closed", extra={"upstream": upstream})

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
        if not isinstance(self.store, RedisStore):
            return None
        # Asked afresh for each probe or scrape, never cached: readiness is Redis's state
        # now. Probes that arrive while a check is out share it (the store pings on one
        # connection of its own), so Redis sees at most one PING at a time per process.
        if self._store_check is None:
            self._store_check = asyncio.get_running_loop().create_task(_store_problem(self.store))
            self._store_check.add_done_callback(self._store_checked)
        return await asyncio.shield(self._store_check)

    def _store_checked(self, task: asyncio.Task[str | None]) -> None:
        if self._store_check is task:
            self._store_check = None

    async def aclose(self) -> None:
        try:
            if self._drain is not None:
                await self._drain
        finally:
            if self._store_check is not None:  # a readiness check out: not past the close
                self._store_check.cancel()
                await asyncio.gather(self._store_check, return_exceptions=True)
            await self.runs.aclose()  # runs first: their last checkpoints need the store
            await self.upstreams.aclose()
            if self.tracing is not None:  # last: the runs' spans end as they close
                await self.tracing.aclose()


async def _store_problem(store: RedisStore) -> str | None:
    try:
        async with asyncio.timeout(STORE_CHECK_TIMEOUT):
            await store.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        return f"redis unreachable: {type(exc).__name__}"
    return None


def make_store(config: State) -> CheckpointStore | None:
    backend = config.backend
    if backend == "redis":
        assert config.redis_url is not None
        # Replicas are waited for where events wait for their checkpoint (sync).
        wanted = config.wait_replicas if config.durability == "sync" else 0
        return RedisStore(
            config.redis_url.get_secret_value(),
            config.pool_size,
            wait_replicas=None if wanted == "auto" else wanted,
            wait_timeout=config.wait_timeout,
        )
    return MemoryStore() if backend == "memory" else None


def gateway_of(request: HTTPConnection) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway

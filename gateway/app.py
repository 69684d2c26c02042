"""The Starlette application: routes, error handlers, and the lifespan that owns clients."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.api import ops
from gateway.api.chat import chat_completions
from gateway.api.gemini import GEMINI_MODELS, gemini_routes, model_method
from gateway.api.messages import create_message
from gateway.api.passthrough import list_models, passthrough
from gateway.api.responses import create_response, retrieve_response
from gateway.api.responses_ws import serve_socket
from gateway.api.runs import run_events
from gateway.config.load import default_config, load_config
from gateway.config.schema import GatewayConfig
from gateway.context import Gateway
from gateway.errors import GatewayError, error_body, google_error
from gateway.inbound import speaks_anthropic, speaks_gemini
from gateway.listen import STATE_KEY, ListenLimits
from gateway.metrics import Metrics, process_exited, sweep_dead_workers
from gateway.observe import CLIENT_CLOSED, Observer, request_log
from gateway.supervisor import exit_with_supervisor

logger = logging.getLogger("gateway")

CONFIG_ENV = "GATEWAY_CONFIG"
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return exc.response(anthropic=speaks_anthropic(request), google=speaks_gemini(request))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail if exc.status_code != 404 else f"Unknown path {request.url.path}."
    body = error_body(message, "invalid_request_error", str(exc.status_code))
    if speaks_gemini(request):
        body = google_error(exc.status_code, message)
    elif speaks_anthropic(request):
        body = {"type": "error", "error": body["error"]}
    return Response(
        orjson.dumps(body), exc.status_code, media_type="application/json", headers=exc.headers
    )


async def _client_gone(request: Request, exc: Exception) -> Response:
    # The client left (or was cut off at listen.body_timeout) while its body was read:
    # nobody will read an answer, and it is not the gateway's error.
    return Response(status_code=CLIENT_CLOSED)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    # The traceback goes to the log, never to the client.
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    error = GatewayError("The gateway failed to handle the request.")
    return error.response(anthropic=speaks_anthropic(request), google=speaks_gemini(request))


def drain_on_sigterm(gateway: Gateway) -> Callable[[], None]:
    """Chain a SIGTERM handler that starts the drain before uvicorn's own shutdown.

    uvicorn stops accepting and waits for open connections; the drain makes sure
    they end by ``listen.drain_timeout``. Returns a function that unchains it.
    Signals are the main thread's: a server run in another thread (tests) has none.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):  # not under uvicorn's handler: the default must stand
        return lambda: None
    loop = asyncio.get_running_loop()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # A fresh context: not that of whichever request the signal interrupted.
        loop.call_soon_threadsafe(gateway.begin_drain, context=contextvars.Context())
        previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, previous)

    return restore


Endpoint = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]
ERROR_HANDLERS: dict[type[Exception], ErrorHandler] = {
    GatewayError: _gateway_error,
    HTTPException: _http_error,
    ClientDisconnect: _client_gone,
    Exception: _unexpected_error,
}


class GatewayApp(Starlette):
    """Starlette, with a short way in for the model calls.

    ``POST`` to a path in ``direct`` (chat completions, responses, messages), or under a
    prefix of ``direct_prefixes`` (Gemini's models), goes
    straight to its endpoint under the ``Observer``: not through Starlette's error
    and exception middleware, router and endpoint wrapper, each of which costs every
    request a few calls and wraps ``send`` once more, which every relayed chunk then
    pays for (BENCHMARKS.md, "512 streams"). The endpoint's errors get the same
    handlers (``ERROR_HANDLERS``) and the same answers. Everything else, and any other
    method on those paths (405), takes Starlette's way.
    """

    def __init__(
        self,
        *,
        direct: Mapping[str, Endpoint],
        direct_prefixes: Mapping[str, Endpoint] | None = None,
        metrics: Metrics,
        content: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._direct = direct
        # Paths that name their model (Gemini's /v1beta/models/{model}:method), by prefix.
        self._prefixes = tuple((direct_prefixes or {}).items())
        self._observed = Observer(self._serve_direct, metrics, content=content)

    def _direct_endpoint(self, path: str) -> Endpoint | None:
        endpoint = self._direct.get(path)
        if endpoint is None:
            for prefix, by_prefix in self._prefixes:
                if path.startswith(prefix):
                    return by_prefix
        return endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self._direct_endpoint(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                scope["endpoint"] = endpoint
                await self._observed(scope, receive, send)
                return
        if scope["type"] == "websocket":  # the Responses API's, or a 426 (api/responses_ws.py)
            scope["app"] = self
            await serve_socket(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _serve_direct(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await scope["endpoint"](request)
        except Exception as exc:
            handler = next(ERROR_HANDLERS[t] for t in type(exc).__mro__ if t in ERROR_HANDLERS)
            if handler is _unexpected_error:  # logged by it; and in the request's line
                request_log().error = type(exc).__name__
            response = await handler(request, exc)
        await response(scope, receive, send)


def create_app(config: GatewayConfig, metrics: Metrics | None = None) -> Starlette:
    metrics = metrics if metrics is not None else Metrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
        sweep_dead_workers()
        gateway = Gateway(config, metrics)
        app.state.gateway = gateway
        await gateway.start()
        restore_sigterm = drain_on_sigterm(gateway)
        try:
            # The lifespan state reaches uvicorn's protocol instances (gateway.listen).
            yield {STATE_KEY: ListenLimits.of(config)}
        finally:
            restore_sigterm()
            await gateway.aclose()
            process_exited()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/messages", create_message, methods=["POST"]),
        Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/runs/{run_id}/events", run_events, methods=["GET"]),
        *gemini_routes(),
        Route("/v1/{path:path}", passthrough, methods=ALL_METHODS),
        Route("/healthz", ops.healthz, methods=["GET"]),
        Route("/readyz", ops.readyz, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
    ]
    return GatewayApp(
        direct={
            "/v1/chat/completions": chat_completions,
            "/v1/responses": create_response,
            "/v1/messages": create_message,
        },
        direct_prefixes=dict.fromkeys(GEMINI_MODELS, model_method),
        metrics=metrics,
        content=config.logging.content,
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(Observer, metrics=metrics, content=config.logging.content)],
        exception_handlers=dict(ERROR_HANDLERS),
    )


def config_from_env() -> GatewayConfig:
    path = os.environ.get(CONFIG_ENV)
    return load_config(path) if path else default_config()


def create_app_from_env() -> Starlette:
    """Factory for uvicorn (``--workers`` needs an import string): config from the env.

    It runs once per worker process, after the imports: what they allocated is frozen
    out of the cycle collector. Its full passes stop the loop while they walk every
    object they track, and the startup heap was half of those at 256 streams
    (BENCHMARKS.md, "Collector pauses"); runs themselves leave no cycles.
    """
    exit_with_supervisor()  # a worker of ``serve --workers N`` dies with it
    app = create_app(config_from_env())
    gc.collect()
    gc.freeze()
    return app

"""The short way in (``GatewayApp``): model-call paths skip Starlette's middleware and
router, and must answer exactly as that way would, errors included."""

from __future__ import annotations

import logging

import pytest
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.app import ERROR_HANDLERS, GatewayApp
from gateway.errors import InvalidRequest
from gateway.metrics import Metrics
from gateway.observe import Observer, request_log


async def ok(request: Request) -> Response:
    request_log().route = "r"
    return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})


async def refused(request: Request) -> Response:
    raise InvalidRequest("The field 'x' is wrong.")


async def broken(request: Request) -> Response:
    raise RuntimeError("internal detail sk-not-for-clients")


def app(metrics: Metrics) -> GatewayApp:
    direct = {"/v1/ok": ok, "/v1/refused": refused, "/v1/broken": broken}
    return GatewayApp(
        direct=direct,
        metrics=metrics,
        content=False,
        # Starlette's way serves the same endpoints, for comparison (and GET).
        routes=[Route(path, endpoint, methods=["GET"]) for path, endpoint in direct.items()],
        middleware=[Middleware(Observer, metrics=metrics)],
        exception_handlers=dict(ERROR_HANDLERS),
    )


def requests(metrics: Metrics, route: str, method: str, status: int) -> float | None:
    labels = {"route": route, "method": method, "status": str(status)}
    return metrics.registry.get_sample_value("gateway_requests_total", labels)


@pytest.mark.parametrize(
    ("path", "status"), [("/v1/ok", 200), ("/v1/refused", 400), ("/v1/broken", 500)]
)
def test_a_direct_post_answers_as_starlettes_way_does(path: str, status: int) -> None:
    metrics = Metrics()
    with TestClient(app(metrics), raise_server_exceptions=False) as client:
        direct, routed = client.post(path, content=b"hi"), client.get(path)
    assert direct.status_code == routed.status_code == status
    if status == 200:
        assert direct.json() == {"path": path, "body": "hi"}
    else:
        assert direct.json() == routed.json()
        assert "internal detail" not in direct.text and "sk-not-for-clients" not in direct.text
    # Both observed: counted once each, under the route the endpoint named.
    route = "r" if status == 200 else "passthrough"
    assert requests(metrics, route, "POST", status) == 1
    assert requests(metrics, route, "GET", status) == 1


def test_an_unexpected_error_on_a_direct_path_is_logged_once_and_in_its_request_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.INFO),
        TestClient(app(Metrics()), raise_server_exceptions=False) as client,
    ):
        assert client.post("/v1/broken").status_code == 500
    failures = [r for r in caplog.records if r.getMessage().startswith("unhandled error")]
    assert len(failures) == 1 and failures[0].exc_info is not None
    [line] = [r for r in caplog.records if r.name == "gateway.access"]
    assert line.__dict__["error"] == "RuntimeError" and line.__dict__["status"] == 500

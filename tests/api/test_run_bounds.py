"""Bounded runs (issue 40 item 4): one run's size, and the memory of runs nobody reads.

Real sockets: the gateway under uvicorn, the chaos upstream for each protocol.
"""

from __future__ import annotations

import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from gateway.app import create_app
from gateway.chaos import ChaosUpstream, expected_answer
from gateway.config.schema import GatewayConfig
from gateway.metrics import Metrics
from gateway.runs.registry import TRIM_DELAY, Runs
from gateway.serve import in_thread
from tests.api.test_backpressure import DELTA, DELTAS, fast_large_answer, stream_request
from tests.raw_upstream import running_raw_upstream
from tests.servers import RunningGateway, gateway_config, running_gateway, wait_for

LIMIT = 40_000  # bytes of events: a few hundred chat chunks
MB = 1024 * 1024
LONG = "chaos:text=4000"  # several hundred KB of events in any protocol
KEY = {"authorization": "Bearer sk-test-client", "x-goog-api-key": "k"}


def config(chaos: ChaosUpstream, kind: str = "openai", **state: Any) -> GatewayConfig:
    root = chaos.base_url.removesuffix("/v1")
    base = {"anthropic": root, "gemini": root + "/v1beta"}.get(kind, chaos.base_url)
    upstream = {"kind": kind, "timeouts": {"connect": 2, "first_byte": 3, "idle": 2}}
    return gateway_config(base, upstream=upstream, state={"max_run_bytes": LIMIT} | state)


def counted(gateway: RunningGateway, name: str, **labels: str) -> float:
    value = gateway.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


@pytest.fixture
def bounded(chaos: ChaosUpstream, request: pytest.FixtureRequest) -> Iterator[RunningGateway]:
    with running_gateway(config(chaos, request.param)) as running:
        yield running


def stream(gateway: RunningGateway, path: str, body: dict[str, Any]) -> httpx2.Response:
    with httpx2.Client(base_url=gateway.url, timeout=20) as http:
        response = http.post(path, json=body | {"stream": True}, headers=KEY)
    assert response.status_code == 200, response.content
    return response


def data(raw: bytes) -> list[Any]:
    """The JSON ``data:`` payloads of an SSE body, in order."""
    lines = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    return [orjson.loads(line) for line in lines if line != b"[DONE]"]


def assert_cut_near_the_limit(raw: bytes, gateway: RunningGateway) -> None:
    # Past the limit by the event that crossed it and the error, no more: the upstream
    # was closed, nothing else relayed.
    assert LIMIT < len(raw) < LIMIT + 4_000
    assert counted(gateway, "gateway_runs_too_large_total") == 1
    wait_for(lambda: counted(gateway, "gateway_active_streams") == 0, message="still relaying")


@pytest.mark.parametrize("bounded", ["openai"], indirect=True)
def test_a_chat_stream_past_max_run_bytes_ends_with_its_in_band_error(
    bounded: RunningGateway,
) -> None:
    response = stream(bounded, "/v1/chat/completions", {"model": LONG, "messages": []})
    events = data(response.content)
    error = events[-1]["error"]
    assert error["code"] == "run_too_large"
    assert "state.max_run_bytes" in error["message"]
    assert b"[DONE]" not in response.content  # an error, not a clean end
    assert all(e.get("choices", [{}])[0].get("finish_reason") is None for e in events[:-1])
    assert_cut_near_the_limit(response.content, bounded)


@pytest.mark.parametrize("bounded", ["openai"], indirect=True)
def test_a_responses_stream_past_max_run_bytes_ends_with_error_and_response_failed(
    bounded: RunningGateway,
) -> None:
    response = stream(bounded, "/v1/responses", {"model": LONG, "input": "Tell me."})
    error, failed = data(response.content)[-2:]
    assert error["type"] == "error" and error["code"] == "run_too_large"
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "run_too_large"
    assert b"response.completed" not in response.content
    assert_cut_near_the_limit(response.content, bounded)


@pytest.mark.parametrize("bounded", ["anthropic"], indirect=True)
def test_a_messages_stream_past_max_run_bytes_ends_with_event_error(
    bounded: RunningGateway,
) -> None:
    body = {"model": LONG, "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]}
    response = stream(bounded, "/v1/messages", body)
    assert response.content.rstrip().split(b"\n")[-2] == b"event: error"
    events = data(response.content)
    assert events[-1]["type"] == "error"
    assert "state.max_run_bytes" in events[-1]["error"]["message"]
    assert events[-2]["type"] == "content_block_stop"  # the open block closed first
    assert b"message_stop" not in response.content
    assert_cut_near_the_limit(response.content, bounded)


@pytest.mark.parametrize("bounded", ["gemini"], indirect=True)
def test_a_gemini_stream_past_max_run_bytes_ends_with_googles_error_object(
    bounded: RunningGateway,
) -> None:
    path = f"/v1beta/models/{LONG}:streamGenerateContent?alt=sse"
    body = {"contents": [{"role": "user", "parts": [{"text": "Tell me."}]}]}
    response = stream(bounded, path, body)
    chunks, _, tail = response.content.rpartition(b"\n\n")
    error = orjson.loads(tail or chunks.rpartition(b"\n\n")[2])["error"]
    assert error["status"] == "INTERNAL"
    assert "state.max_run_bytes" in error["message"]
    assert b'"finishReason"' not in response.content
    assert_cut_near_the_limit(response.content, bounded)


@pytest.mark.parametrize("bounded", ["openai"], indirect=True)
def test_an_answer_under_max_run_bytes_is_not_touched(bounded: RunningGateway) -> None:
    response = stream(bounded, "/v1/chat/completions", {"model": "chaos:text=20", "messages": []})
    assert response.content.endswith(b"data: [DONE]\n\n")
    assert counted(bounded, "gateway_runs_too_large_total") == 0


# -- detached_memory ----------------------------------------------------------------------


def leave_early(gateway: RunningGateway, model: str, events: int) -> str:
    """Start a chat stream, read ``events`` events, hang up; the run's id."""
    body = {"model": model, "messages": [], "stream": True}
    with (
        httpx2.Client(base_url=gateway.url, timeout=20) as http,
        http.stream("POST", "/v1/chat/completions", json=body, headers=KEY) as response,
    ):
        lines = response.iter_lines()
        for _ in range(events):
            while not next(lines).startswith("data: "):
                pass
        return response.headers["x-run-id"]


def resume(gateway: RunningGateway, run_id: str, after: int = 0) -> httpx2.Response:
    headers = {"authorization": KEY["authorization"], "last-event-id": str(after)}
    return httpx2.get(f"{gateway.url}/v1/runs/{run_id}/events", headers=headers, timeout=20)


def test_over_detached_memory_finished_runs_go_first_then_the_growing_run_is_stopped(
    chaos: ChaosUpstream,
) -> None:
    # No store: a finished run is kept here for late resumers, and held once its client left.
    with running_gateway(
        config(chaos, store="off", detached_memory=80_000, max_run_bytes=MB)
    ) as gateway:
        finished = stream(gateway, "/v1/chat/completions", {"model": "chaos:text=200"})
        assert finished.content.endswith(b"data: [DONE]\n\n")
        run_a = finished.headers["x-run-id"]
        held = wait_for(lambda: counted(gateway, "gateway_detached_run_bytes"))
        assert held == len(finished.content)  # its whole log, from when its client left
        assert resume(gateway, run_a).status_code == 200  # kept: still here

        run_b = leave_early(gateway, "chaos:text=2000,pace_ms=2", events=3)
        # B goes on detached and grows: past 80 KB, A is let go, then B is stopped.
        evicted = "gateway_detached_runs_evicted_total"
        wait_for(lambda: counted(gateway, evicted, reason="over_budget"), timeout=10)
        assert counted(gateway, evicted, reason="finished") == 1
        assert counted(gateway, "gateway_detached_runs_cancelled_total") == 0  # not its grace
        wait_for(lambda: counted(gateway, "gateway_detached_run_bytes") == 0)
        wait_for(lambda: counted(gateway, "gateway_active_streams") == 0, message="B relays")
        for run_id in (run_a, run_b):  # memory only: gone, as an expired run is
            gone = resume(gateway, run_id)
            assert gone.status_code == 404
            assert gone.json()["error"]["code"] == "run_not_found"


def test_a_run_stopped_for_detached_memory_is_checkpointed_and_resumes_whole(
    chaos: ChaosUpstream,
) -> None:
    model = "chaos:text=600,pace_ms=2"
    with running_gateway(
        config(chaos, detached_memory=20_000, max_run_bytes=MB)
    ) as gateway:  # in-memory store
        run_id = leave_early(gateway, model, events=3)
        evicted = "gateway_detached_runs_evicted_total"
        wait_for(lambda: counted(gateway, evicted, reason="over_budget"), timeout=10)
        wait_for(lambda: counted(gateway, "gateway_active_streams") == 0, message="still relaying")
        # Its last checkpoint, as at the end of a detach grace: a resume continues it.
        rest = resume(gateway, run_id, after=3)
    assert rest.status_code == 200
    assert rest.content.endswith(b"data: [DONE]\n\n")
    assert expected_answer(model).text.endswith(text_of(rest.content)[-200:])
    assert counted(gateway, "gateway_detached_runs_evicted_total", reason="finished") == 0


def test_a_detached_run_that_ends_frees_its_log_at_once(chaos: ChaosUpstream) -> None:
    # Not when its detach grace would have ended: that timer must not keep the answer.
    metrics = Metrics()
    app = create_app(config(chaos, max_run_bytes=MB), metrics)
    with in_thread(app) as url:
        runs: Runs = app.state.gateway.runs
        run_id = leave_early(RunningGateway(url, metrics), "chaos:text=300,pace_ms=2", events=3)
        log = weakref.ref(runs.local[run_id].log)
        wait_for(lambda: run_id not in runs.local, message="still relaying")
        wait_for(lambda: log() is None, timeout=2, message="the log outlived its run")
        assert runs.held == 0


def text_of(raw: bytes) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for event in data(raw)
        for choice in event.get("choices", [])
    )


# -- the never-reading client (issue 40: 4 x 50 MB kept after the clients closed) ---------

CLIENTS = 4
BUDGET = 24 * MB
REFUSED = 12 * MB


def open_unread(url: str) -> socket.socket:
    """A stream request whose client reads the response head, then nothing."""
    sock = stream_request(url)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    return sock


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


class Sampler:
    """The largest value ``measure`` took, sampled every millisecond in a thread."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self.measure, self.peak, self._stop = measure, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self.measure())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_clients_that_never_read_then_close_cannot_hold_more_than_detached_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with running_raw_upstream(fast_large_answer) as upstream:
        config = gateway_config(
            upstream.base_url,
            # Left behind after 1 s of reading nothing (the patience is the grace).
            limits={"max_client_lag_bytes": 256 * 1024},
            state={"detach_grace": 1.0, "detached_memory": BUDGET},
        )
        metrics = Metrics()
        app = create_app(config, metrics)
        with in_thread(app) as url:
            runs: Runs = app.state.gateway.runs
            before = rss_mb()
            with Sampler(lambda: runs.held) as held:
                sockets = [open_unread(url) for _ in range(CLIENTS)]
                time.sleep(3)  # paused by back-pressure, then left behind: held, and bounded
                during = rss_mb()
                for sock in sockets:
                    sock.close()  # with unread data: a reset
                wait_for(lambda: not runs.local, timeout=30, message="runs still relaying")
                wait_for(lambda: runs.held == 0, message="logs still held")
            time.sleep(TRIM_DELAY + 0.5)  # the heap given back (glibc)
            after = rss_mb()
            evicted = metrics.registry.get_sample_value(
                "gateway_detached_runs_evicted_total", {"reason": "over_budget"}
            )
    # 4 x 32 MB answers: without the budget all of them (the 4 x 50 MB kept 473 MB).
    # Past the budget by what a refused run brings, no more: its log when it is first held
    # (the lag limit and what the kernel's socket buffers took, ~4.5 MB on loopback) and
    # what it reads before its cancellation lands.
    assert held.peak <= BUDGET + REFUSED
    assert evicted and evicted >= 1
    assert sum(upstream.sent) < CLIENTS * len(DELTA) * DELTAS  # not every answer was read
    with capsys.disabled():
        print(
            f"\nnever-reading clients: held peak {held.peak / MB:.1f} MB (budget "
            f"{BUDGET // MB} MB); RSS {before:.0f} -> {during:.0f} -> {after:.0f} MB"
        )

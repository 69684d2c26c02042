"""Logs of a real gateway process: one JSON line per request, and never a secret."""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.logs import TextFormatter
from tests.processes import BIN, Replica, Replicas, wait_until
from tests.servers import free_port

UPSTREAM_KEY = "sk-upstream-CANARY-7f3a9c"
GATEWAY_KEY = "gk-client-CANARY-51d2e8"
PROMPT = "PROMPT-CANARY: the launch codes are 0000"
CLEAN = "chaos:text=30,seed=3"
RECOVERED = "chaos:text=30,seed=4,fault=reset,at=6,times=1"
HEADERS = {"authorization": f"Bearer {GATEWAY_KEY}"}
CONFIG = """
upstreams:
  - name: chaos
    base_url: {chaos}
    api_key: ${{UPSTREAM_KEY}}
routes:
  - match: "*"
    upstream: chaos
    retry: {{retries: 1, backoff_initial: 0, backoff_max: 0}}
auth:
  keys: ["${{GATEWAY_KEY}}"]
logging:
  content: {content}
"""


def chat(replica: Replica, model: str, *, stream: bool = True) -> httpx2.Response:
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": PROMPT}]}
    return httpx2.post(replica.base_url + "/chat/completions", json=body, headers=HEADERS)


def start(chaos: ChaosUpstream, tmp_path: Path, *, content: bool) -> tuple[Replicas, Replica]:
    config = tmp_path / "gateway.yaml"
    config.write_text(CONFIG.format(chaos=chaos.base_url, content=str(content).lower()))
    replicas = Replicas(config, tmp_path)
    [replica] = replicas.start(
        "logs",
        args=["--log-level", "debug", "--log-format", "json"],
        env={"UPSTREAM_KEY": UPSTREAM_KEY, "GATEWAY_KEY": GATEWAY_KEY},
    )
    return replicas, replica


def stopped_log(replicas: Replicas, replica: Replica) -> str:
    replica.terminate()
    replica.process.wait(15)
    return replica.log.read_text()


def records(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line]


def requests(log: str) -> list[dict[str, Any]]:
    """The request lines, without the test harness's readiness polls."""
    return [r for r in records(log) if r["logger"] == "gateway.access" and r["path"] != "/readyz"]


@pytest.fixture
def served(chaos: ChaosUpstream, tmp_path: Path) -> Iterator[tuple[Replicas, Replica]]:
    replicas, replica = start(chaos, tmp_path, content=False)
    with replicas:
        yield replicas, replica


def test_one_json_line_per_request_and_no_key_prompt_or_completion(
    served: tuple[Replicas, Replica],
) -> None:
    replicas, replica = served
    clean, recovered = chat(replica, CLEAN), chat(replica, RECOVERED)
    assert clean.text.endswith("[DONE]\n\n") and recovered.text.endswith("[DONE]\n\n")
    assert chat(replica, CLEAN, stream=False).status_code == 200
    assert httpx2.post(replica.base_url + "/chat/completions", headers=HEADERS).status_code == 400
    unknown = {**HEADERS, "x-run-id": "nope"}
    resumed = httpx2.post(replica.base_url + "/chat/completions", headers=unknown, json={})
    assert resumed.status_code == 404
    assert httpx2.get(replica.url + "/healthz").status_code == 200
    log = stopped_log(replicas, replica)

    lines = records(log)  # every line is JSON: this fails on any that is not
    assert {"ts", "level", "logger", "msg", "pid"} <= lines[0].keys()
    # At debug level too, httpx2's line per upstream request stays out: ours covers it.
    assert not [r for r in lines if r["logger"].startswith(("httpx", "httpcore"))]
    for secret in (UPSTREAM_KEY, GATEWAY_KEY, "CANARY", PROMPT):
        assert secret not in log
    for model in (CLEAN, RECOVERED):
        completion = expected_answer(model).text
        assert completion[:40] not in log and completion[-40:] not in log

    access = requests(log)
    seen = [(r["method"], r["path"], r["status"], r["route"]) for r in access]
    assert seen == [
        ("POST", "/v1/chat/completions", 200, "*"),
        ("POST", "/v1/chat/completions", 200, "*"),
        ("POST", "/v1/chat/completions", 200, "*"),
        ("POST", "/v1/chat/completions", 400, "none"),
        ("POST", "/v1/chat/completions", 404, "runs"),
        ("GET", "/healthz", 200, "ops"),
    ]
    streams = access[:3]
    for line, recoveries in zip(streams, (0, 1, 0), strict=True):
        assert re.fullmatch(r"[0-9a-f]{32}", line["run_id"])
        assert line["upstream"] == "chaos" and line["outcome"] == "done"
        assert line["recoveries"] == recoveries and line["attempt"] == 1 + recoveries
        assert 0 < line["ttfb_ms"] <= line["duration_ms"] and 0 < line["ttft_ms"]
    assert streams[1]["run_id"] == recovered.headers["x-run-id"]
    [recovery] = [r for r in lines if r["msg"] == "recovery"]
    assert recovery["run_id"] == streams[1]["run_id"]
    assert (recovery["cause"], recovery["plan"]) == ("reset", "continue_text")
    assert access[4]["run_id"] == "nope" and access[4]["resumed_from"] == 0


def test_content_logging_is_off_unless_switched_on(chaos: ChaosUpstream, tmp_path: Path) -> None:
    replicas, replica = start(chaos, tmp_path, content=True)
    with replicas:
        chat(replica, CLEAN)
        log = stopped_log(replicas, replica)
    [line] = requests(log)
    assert line["messages"] == [{"role": "user", "content": PROMPT}]
    assert line["completion"] == expected_answer(CLEAN).text
    assert UPSTREAM_KEY not in log and GATEWAY_KEY not in log


def test_plain_text_on_a_terminal(chaos: ChaosUpstream, tmp_path: Path) -> None:
    """``logging.format: auto`` (the default) writes text when stderr is a TTY."""
    port = free_port()
    parent, child = pty.openpty()
    env = {**os.environ, "GATEWAY_UPSTREAM_BASE_URL": chaos.base_url}
    process = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port)], stderr=child, stdout=child, env=env
    )
    os.close(child)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(url), "gateway ready")
        httpx2.post(url + "/v1/chat/completions", json={"model": CLEAN, "stream": True})
        output = b""
        deadline = time.monotonic() + 10
        while b"gateway.access" not in output and time.monotonic() < deadline:
            output += os.read(parent, 65536)
    finally:
        process.terminate()
        process.wait(15)
        os.close(parent)
    text = output.decode()
    [line] = [line for line in text.splitlines() if "gateway.access" in line]
    assert re.match(r"\d\d:\d\d:\d\d\.\d{3} INFO +gateway\.access: request method=POST ", line)
    assert " status=200 " in line and " route=* " in line
    assert not any(line.lstrip().startswith("{") for line in text.splitlines())


def _ready(url: str) -> bool:
    try:
        return httpx2.get(url + "/readyz", timeout=1).status_code == 200
    except httpx2.HTTPError:
        return False


def test_a_text_line_cannot_be_forged_through_a_field() -> None:
    """``%0A`` in a URL is a newline in the path: text lines quote and escape it."""
    record = logging.LogRecord("gateway.access", logging.INFO, "", 0, "request", None, None)
    record.path = "/v1/x\n12:00:00.000 INFO     gateway.access: request status=200"
    line = TextFormatter().format(record)
    assert "\n" not in line and 'path="/v1/x\\n12:00' in line

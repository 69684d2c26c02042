"""The console script, run as a new user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.servers import free_port

CLI = [sys.executable, "-m", "gateway"]


@pytest.fixture
def served(chaos: ChaosUpstream) -> Iterator[str]:
    """``resumable-gateway serve`` with embedded defaults, pointed at the chaos upstream."""
    port = free_port()
    env = os.environ | {"GATEWAY_UPSTREAM_BASE_URL": chaos.base_url}
    env.pop("GATEWAY_CONFIG", None)
    process = subprocess.Popen(
        [*CLI, "serve", "--port", str(port)], env=env, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)
        assert process.stderr is not None
        process.stderr.close()


def test_serve_with_embedded_defaults_streams_to_the_openai_sdk(served: str) -> None:
    model = "chaos:text=25,seed=11"
    with OpenAI(base_url=served + "/v1", api_key="sk-x", max_retries=0) as client:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == expected_answer(model).text


def test_check_config_prints_masked_routes(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstreams:\n  - name: up\n    base_url: http://x/v1\n    api_key: ${SECRET_KEY}\n"
    )
    env = os.environ | {"SECRET_KEY": "sk-very-secret-0123456789"}
    result = subprocess.run(
        [*CLI, "check-config", str(path)], env=env, capture_output=True, text=True, check=True
    )
    assert "*: up/<requested>" in result.stdout
    assert "sk-very-secret" not in result.stdout
    assert "config OK" in result.stdout


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("upstreams:\n  - name: up\n    base_url: http://x\n    timeouts: {idle: -1}\n")
    for command in (["check-config", str(path)], ["serve", "--config", str(path)]):
        result = subprocess.run([*CLI, *command], capture_output=True, text=True)
        assert result.returncode == 2
        assert "upstreams.0.timeouts.idle" in result.stderr


@pytest.mark.parametrize("command", [[], ["serve"], ["chaos-upstream"], ["check-config"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = subprocess.run([*CLI, *command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "usage:" in result.stdout

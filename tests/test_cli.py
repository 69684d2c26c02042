"""The console script, run as a new user runs it."""

from __future__ import annotations

import contextlib
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

# The console script pyproject.toml installs, next to the interpreter running the tests.
CLI = [str(Path(sys.executable).with_name("resumable-gateway"))]


@contextlib.contextmanager
def serving(args: list[str], env: dict[str, str], probe: str) -> Iterator[str]:
    """Run a CLI server command and wait until ``probe`` answers 200."""
    port = free_port()
    process = subprocess.Popen([*CLI, *args, "--port", str(port)], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + probe).status_code == 200:
                    break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_with_embedded_defaults_streams_to_the_openai_sdk(
    chaos: ChaosUpstream, workers: str
) -> None:
    env = os.environ | {"GATEWAY_UPSTREAM_BASE_URL": chaos.base_url}
    env.pop("GATEWAY_CONFIG", None)
    model = "chaos:text=25,seed=11"
    with (
        serving(["serve", "--workers", workers], env, "/healthz") as served,
        OpenAI(base_url=served + "/v1", api_key="sk-x", max_retries=0) as client,
    ):
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == expected_answer(model).text


def test_chaos_upstream_command_serves_the_chaos_api() -> None:
    with serving(["chaos-upstream"], dict(os.environ), "/v1/models") as url:
        response = httpx.post(
            url + "/v1/chat/completions", json={"model": "chaos:text=3", "messages": []}
        )
    assert (
        response.json()["choices"][0]["message"]["content"] == expected_answer("chaos:text=3").text
    )


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

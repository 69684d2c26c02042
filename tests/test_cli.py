"""The console script, run as a new user runs it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx2
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.cli import cgroup_cpu_quota, default_workers, open_proxy_warning
from gateway.config.load import parse_config
from gateway.config.schema import GatewayConfig
from tests.servers import free_port

# The console script pyproject.toml installs, next to the interpreter running the tests.
CLI = [str(Path(sys.executable).with_name("resumable-gateway"))]


@contextlib.contextmanager
def serving(
    args: list[str], env: dict[str, str], probe: str, stderr: IO[bytes] | None = None
) -> Iterator[str]:
    """Run a CLI server command and wait until ``probe`` answers 200."""
    port = free_port()
    process = subprocess.Popen([*CLI, *args, "--port", str(port)], env=env, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx2.get(url + probe).status_code == 200:
                    break
            except httpx2.TransportError:
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


def test_workers_default_to_the_usable_cpus_only_with_redis_state() -> None:
    upstreams = {"upstreams": [{"name": "u", "base_url": "http://127.0.0.1:9/v1"}]}
    with_redis = parse_config({**upstreams, "state": {"redis_url": "redis://127.0.0.1:6379/0"}})
    in_memory = parse_config({**upstreams, "state": {"store": "memory"}})
    checkpoints_off = parse_config({**upstreams, "state": {"store": "off"}})
    quota = cgroup_cpu_quota()
    usable = len(os.sched_getaffinity(0))
    expected = usable if quota is None else max(1, min(usable, math.ceil(quota)))
    assert default_workers(with_redis) == expected
    # A run in one process's memory is resumable only there: one worker.
    assert default_workers(in_memory) == default_workers(checkpoints_off) == 1


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),  # cgroup v2, --cpus 1.5
        ({"cpu.max": "max 100000\n"}, None),  # v2, no limit
        ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),  # no cgroup CPU controller at all
    ],
)
def test_the_cgroup_cpu_quota_is_read_as_docker_and_kubernetes_set_it(
    tmp_path: Path, files: dict[str, str], quota: float | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota


def test_chaos_upstream_command_serves_the_chaos_api() -> None:
    with serving(["chaos-upstream"], dict(os.environ), "/v1/models") as url:
        response = httpx2.post(
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
    # Not OpenAI's own API: its Responses requests are not asked in the background.
    assert "background responses of up: off (default for openai at this base_url)" in (
        result.stdout
    )
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


UPSTREAM_KEY = "sk-upstream-CANARY-0c41d9"


def config(*, key: bool = True, gateway_keys: bool = False, **upstream: Any) -> GatewayConfig:
    data: dict[str, Any] = {
        "upstreams": [
            {"name": "openai", "base_url": "https://api.openai.com/v1", **upstream},
            {"name": "local", "base_url": "http://127.0.0.1:8000/v1"},
        ]
    }
    if key:
        data["upstreams"][0]["api_key"] = UPSTREAM_KEY
    if gateway_keys:
        data["auth"] = {"keys": ["gk-client-key"]}
    return parse_config(data, "test")


def test_open_proxy_warning_names_the_keyed_upstream_and_both_fixes() -> None:
    warning = open_proxy_warning(config(), "0.0.0.0")
    assert warning is not None
    assert "open proxy" in warning and "0.0.0.0" in warning
    assert "upstream 'openai'" in warning and "'local'" not in warning
    assert "auth.keys" in warning and "--host 127.0.0.1" in warning
    assert UPSTREAM_KEY not in warning and UPSTREAM_KEY[-4:] not in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_no_open_proxy_warning_on_loopback(host: str) -> None:
    assert open_proxy_warning(config(), host) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.internal", ""])
def test_open_proxy_warning_beyond_loopback(host: str) -> None:
    assert open_proxy_warning(config(), host) is not None


def test_no_open_proxy_warning_without_an_upstream_key() -> None:
    # Clients then bring their own key, passed through: nothing of the operator's is spent.
    assert open_proxy_warning(config(key=False), "0.0.0.0") is None
    assert open_proxy_warning(config(key=False, api_key=""), "0.0.0.0") is None


def test_an_upstream_credential_header_is_a_key_too() -> None:
    keyed = config(key=False, headers={"Api-Key": UPSTREAM_KEY})
    assert open_proxy_warning(keyed, "0.0.0.0") is not None
    other = config(key=False, headers={"HTTP-Referer": "https://example.com"})
    assert open_proxy_warning(other, "0.0.0.0") is None


def test_no_open_proxy_warning_with_gateway_keys() -> None:
    assert open_proxy_warning(config(gateway_keys=True), "0.0.0.0") is None


@pytest.mark.parametrize(("host", "warns"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_serve_warns_at_start_when_it_is_an_open_proxy(
    chaos: ChaosUpstream, tmp_path: Path, host: str, warns: bool
) -> None:
    env = os.environ | {
        "GATEWAY_UPSTREAM_BASE_URL": chaos.base_url,
        "GATEWAY_UPSTREAM_API_KEY": UPSTREAM_KEY,
    }
    env.pop("GATEWAY_CONFIG", None)
    log = tmp_path / "stderr.log"
    with log.open("wb") as stderr:
        args = ["serve", "--host", host, "--log-format", "json"]
        with serving(args, env, "/healthz", stderr=stderr):
            pass
    text = log.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    warnings = [line for line in lines if line["logger"] == "gateway.cli"]
    if warns:
        (warning,) = warnings
        assert warning["level"] == "warning"
        assert "open proxy" in warning["msg"] and "upstream 'default'" in warning["msg"]
    else:
        assert warnings == []
    assert UPSTREAM_KEY not in text


def test_a_certificate_file_that_cannot_be_read_stops_check_config_and_serve(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    missing = tmp_path / "absent-ca.pem"
    path.write_text(
        f"upstreams:\n  - name: up\n    base_url: https://x\n    tls: {{ca_file: {missing}}}\n"
    )
    for command in (["check-config", str(path)], ["serve", "--config", str(path)]):
        result = subprocess.run([*CLI, *command], capture_output=True, text=True)
        assert result.returncode == 2
        assert "upstreams.up.tls: a certificate or key file cannot be loaded" in result.stderr
        assert "Traceback" not in result.stderr


def test_an_otlp_grpc_protocol_stops_check_config_and_serve_with_what_to_set(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "upstreams:\n  - name: up\n    base_url: http://x/v1\n"
        "tracing:\n  enabled: true\n  endpoint: http://user:pw-0451@collector:4318\n"
    )
    shown = subprocess.run(
        [*CLI, "check-config", str(path)], capture_output=True, text=True, check=True
    )
    assert "tracing: on  endpoint=http://user:****@collector:4318" in shown.stdout
    assert "pw-0451" not in shown.stdout
    env = os.environ | {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    for command in (["check-config", str(path)], ["serve", "--config", str(path)]):
        result = subprocess.run([*CLI, *command], capture_output=True, text=True, env=env)
        assert result.returncode == 2
        assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in result.stderr
        assert "http/protobuf" in result.stderr and "Traceback" not in result.stderr


def test_an_otlp_grpc_protocol_is_not_read_while_tracing_is_off(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("upstreams:\n  - name: up\n    base_url: http://x/v1\n")
    env = os.environ | {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    shown = subprocess.run(
        [*CLI, "check-config", str(path)], capture_output=True, text=True, env=env
    )
    assert shown.returncode == 0, shown.stderr
    assert "config OK" in shown.stdout

"""What /metrics says after scripted streams: exact counts, one process and two workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gateway.chaos import ChaosUpstream
from tests.processes import Replica, Replicas, wait_until
from tests.servers import RunningGateway, gateway_config, running_gateway

CLEAN = "chaos:text=8,usage=true"
RECOVERED = "chaos:text=20,fault=reset,at=5,times=1,usage=true"
FAILED = "chaos:text=20,fault=reset,at=5"  # every attempt breaks: the budget runs out
NO_BACKOFF = {"retries": 1, "backoff_initial": 0, "backoff_max": 0, "idle_retry_delay": 0}


def scrape(url: str) -> dict[str, list[Sample]]:
    response = httpx2.get(url + "/metrics", follow_redirects=False)
    assert response.status_code == 200
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    """The one sample called ``name`` with exactly ``labels`` (0 when there is none)."""
    found = [s.value for s in samples.get(name, []) if s.labels == labels]
    assert len(found) <= 1
    return found[0] if found else 0.0


def stream(base_url: str, model: str) -> httpx2.Response:
    body = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
    return httpx2.post(base_url + "/chat/completions", json=body)


def usage_of(response: httpx2.Response) -> dict[str, int]:
    [usage] = [
        json.loads(line[6:])["usage"]
        for line in response.text.splitlines()
        if line.startswith("data: {") and '"usage":{' in line
    ]
    assert isinstance(usage, dict)
    return usage


@pytest.fixture
def gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    routes = [{"match": "*", "upstream": "chaos", "retry": NO_BACKOFF}]
    with running_gateway(gateway_config(chaos.base_url, routes=routes)) as running:
        yield running


def test_counters_after_a_clean_a_recovered_and_a_failed_stream(gateway: RunningGateway) -> None:
    clean = stream(gateway.base_url, CLEAN)
    recovered = stream(gateway.base_url, RECOVERED)
    failed = stream(gateway.base_url, FAILED)
    assert clean.text.endswith("data: [DONE]\n\n") and recovered.text.endswith("[DONE]\n\n")
    assert '"code":"upstream_interrupted"' in failed.text
    m = scrape(gateway.url)

    route = {"route": "*"}
    assert value(m, "gateway_requests_total", method="POST", status="200", **route) == 3
    assert value(m, "gateway_active_streams") == 0
    assert value(m, "gateway_ready") == 1
    for histogram in ("time_to_first_byte", "time_to_first_token", "stream_duration"):
        assert value(m, f"gateway_{histogram}_seconds_count", **route) == 3
    # Every attempt of the failed stream and the first of the recovered one broke.
    assert value(m, "gateway_interruptions_total", upstream="chaos", cause="reset") == 1 + 2
    # Clean 1, recovered 2 (the original and its continuation), failed 2 (retries: 1).
    assert value(m, "gateway_upstream_attempts_total", upstream="chaos", leg="0", result="ok") == 5
    assert value(m, "gateway_recoveries_total", plan="continue_text", outcome="recovered") == 1
    # Both plans tried for the failed stream count as failed: the stream was not rescued.
    assert value(m, "gateway_recoveries_total", plan="continue_text", outcome="failed") == 2
    # Tokens by leg and source. Reported: the clean stream's (leg 0), the recovered
    # one's continuation (leg 1). Estimated: every leg that broke before it reported.
    reported, estimated = {"source": "reported"}, {"source": "estimated"}
    clean_usage, recovered_usage = usage_of(clean), usage_of(recovered)
    assert (
        value(m, "gateway_tokens_total", kind="prompt", leg="0", **reported)
        == (clean_usage["prompt_tokens"])
    )
    assert value(m, "gateway_tokens_total", kind="completion", leg="0", **reported) == 8
    prompt_1 = value(m, "gateway_tokens_total", kind="prompt", leg="1", **reported)
    completion_1 = value(m, "gateway_tokens_total", kind="completion", leg="1", **reported)
    assert prompt_1 > 0 and completion_1 > 0
    # The recovered stream's broken leg 0 and both of the failed stream's legs.
    assert value(m, "gateway_tokens_total", kind="prompt", leg="0", **estimated) > 0
    assert value(m, "gateway_tokens_total", kind="completion", leg="0", **estimated) > 0
    assert value(m, "gateway_tokens_total", kind="completion", leg="1", **estimated) > 0
    # The client's usage sums both legs: what the upstream billed for the answer's 20
    # tokens, give or take the estimate of the broken leg.
    assert recovered_usage["completion_tokens"] > completion_1
    assert abs(recovered_usage["completion_tokens"] - 20) <= 2
    relayed = len(clean.content) + len(recovered.content) + len(failed.content)
    assert value(m, "gateway_relayed_bytes_total", **route) == relayed


def test_errors_and_other_routes_are_counted_by_route_and_status(
    gateway: RunningGateway,
) -> None:
    httpx2.post(gateway.base_url + "/chat/completions", content=b"{")  # invalid JSON
    httpx2.get(gateway.base_url + "/models")
    httpx2.get(gateway.url + "/healthz")
    httpx2.get(gateway.url + "/nowhere")
    m = scrape(gateway.url)
    assert value(m, "gateway_requests_total", route="none", method="POST", status="400") == 1
    assert value(m, "gateway_requests_total", route="passthrough", method="GET", status="200") == 1
    assert value(m, "gateway_requests_total", route="ops", method="GET", status="200") == 1
    assert value(m, "gateway_requests_total", route="none", method="GET", status="404") == 1
    # Only chat completions have a time to first byte.
    assert "gateway_time_to_first_byte_seconds_count" not in m


def test_metrics_is_served_at_its_path_without_a_redirect(gateway: RunningGateway) -> None:
    response = httpx2.get(gateway.url + "/metrics", follow_redirects=False)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert "gateway_requests_total" in response.text
    assert "_created" not in response.text


# -- several workers ---------------------------------------------------------------------


def worker_pids(replica: Replica) -> set[int]:
    """The workers that logged a request (JSON lines carry the process id). The last line
    may be one a worker is still writing: only whole lines are read."""
    text = replica.log.read_text()
    lines = text[: text.rfind("\n") + 1].splitlines()
    return {
        record["pid"]
        for record in map(json.loads, filter(None, lines))
        if record.get("logger") == "gateway.access"
    }


def test_two_workers_share_one_set_of_counters(chaos: ChaosUpstream, tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(f"upstreams: [{{name: chaos, base_url: '{chaos.base_url}'}}]\n")
    directory = tmp_path / "metrics"
    directory.mkdir()
    # A file a previous run left behind: its counts must not be added to this run's.
    (directory / "counter_99999.db").write_bytes(b"stale")
    with Replicas(config, tmp_path) as replicas:
        [replica] = replicas.start(
            "workers",
            args=["--workers", "2", "--log-level", "info", "--log-format", "json"],
            env={"PROMETHEUS_MULTIPROC_DIR": str(directory)},
        )
        assert not (directory / "counter_99999.db").exists()
        sent = 0
        # New connections until both workers have served some (the kernel picks).
        while len(worker_pids(replica)) < 2 and sent < 400:
            assert stream(replica.base_url, CLEAN).status_code == 200
            sent += 1
        wait_until(lambda: len(worker_pids(replica)) == 2, "both workers served a request")
        # Every scrape, whichever worker answers it, counts the requests of both.
        for _ in range(10):
            samples = replica.samples("gateway_requests_total")
            chat = [s.value for s in samples if s.labels["route"] == "*"]
            assert chat == [sent]

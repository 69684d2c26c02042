"""Health, readiness and the first metrics."""

from __future__ import annotations

import httpx2
from openai import OpenAI

from gateway.chaos import ChaosUpstream
from tests.redis_server import running_redis
from tests.servers import RunningGateway, free_port, gateway_config, running_gateway


def test_healthz_and_readyz_without_redis(gateway: RunningGateway) -> None:
    assert httpx2.get(gateway.url + "/healthz").json() == {"status": "ok"}
    assert httpx2.get(gateway.url + "/readyz").json() == {"status": "ready"}


def test_readyz_reports_an_unreachable_redis(chaos: ChaosUpstream) -> None:
    config = gateway_config(
        chaos.base_url, state={"redis_url": f"redis://127.0.0.1:{free_port()}/0"}
    )
    with running_gateway(config) as gateway:
        response = httpx2.get(gateway.url + "/readyz")
        assert response.status_code == 503
        assert "redis unreachable" in response.json()["reason"]
        assert httpx2.get(gateway.url + "/healthz").status_code == 200


def test_readyz_is_ready_with_a_live_redis(chaos: ChaosUpstream) -> None:
    with running_redis() as redis_server:
        config = gateway_config(chaos.base_url, state={"redis_url": redis_server.url})
        with running_gateway(config) as gateway:
            assert httpx2.get(gateway.url + "/readyz").status_code == 200
            redis_server.stop()
            assert httpx2.get(gateway.url + "/readyz").status_code == 503


def test_metrics_count_requests_streams_and_ttft(client: OpenAI, gateway: RunningGateway) -> None:
    for _ in range(3):
        list(client.chat.completions.create(model="chaos:text=4", messages=[], stream=True))
    httpx2.post(gateway.base_url + "/chat/completions", content=b"{")
    text = httpx2.get(gateway.url + "/metrics").text
    assert 'gateway_requests_total{method="POST",route="*",status="200"} 3.0' in text
    assert 'gateway_requests_total{method="POST",route="none",status="400"} 1.0' in text
    assert 'gateway_time_to_first_token_seconds_count{route="*"} 3.0' in text
    assert "gateway_active_streams 0.0" in text

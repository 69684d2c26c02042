"""Bad input gets a clear OpenAI-shaped error with the right status; the process stays up."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream
from tests.servers import RunningGateway, free_port, gateway_config, running_gateway

MESSAGES = [{"role": "user", "content": "hi"}]


def assert_openai_error(response: httpx2.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    if code is not None:
        assert error["code"] == code
    assert "Traceback" not in response.text


def post(gateway: RunningGateway, content: Any = None, **kwargs: Any) -> httpx2.Response:
    return httpx2.post(gateway.base_url + "/chat/completions", content=content, **kwargs)


@pytest.mark.parametrize("body", [b"{not json", b"", b"\xff\xfe", b'{"model": "m"'])
def test_invalid_json_is_400(gateway: RunningGateway, body: bytes) -> None:
    assert_openai_error(post(gateway, body), 400, "invalid_json")


def test_json_that_is_not_an_object_is_400(gateway: RunningGateway) -> None:
    assert_openai_error(post(gateway, b"[1, 2]"), 400, "invalid_json")


def test_missing_model_is_404(gateway: RunningGateway) -> None:
    assert_openai_error(post(gateway, json={"messages": MESSAGES}), 404, "model_not_found")


@pytest.fixture
def routed_gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    config = gateway_config(
        chaos.base_url,
        routes=[{"match": "chaos*", "upstream": "chaos"}],
        limits={"max_body_bytes": 1024},
    )
    with running_gateway(config) as running:
        yield running


def test_unknown_model_is_404_and_the_sdk_raises_not_found(routed_gateway: RunningGateway) -> None:
    with OpenAI(base_url=routed_gateway.base_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError, match="gpt-unknown"):
            client.chat.completions.create(model="gpt-unknown", messages=MESSAGES)  # type: ignore[arg-type]


def test_body_over_the_limit_is_413(routed_gateway: RunningGateway) -> None:
    big = {"model": "chaos", "messages": [{"role": "user", "content": "x" * 5000}]}
    assert_openai_error(post(routed_gateway, json=big), 413, "request_too_large")

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        yield b'{"model": "chaos", "messages": [{"role": "user", "content": "'
        yield b"x" * 5000
        yield b'"}]}'

    assert_openai_error(post(routed_gateway, chunked()), 413, "request_too_large")


@pytest.mark.parametrize(
    ("fault", "status"),
    [("http_400", 400), ("http_401", 401), ("http_404", 404), ("http_400_context", 400)],
)
def test_upstream_4xx_passes_through_unchanged(
    gateway: RunningGateway, chaos: ChaosUpstream, fault: str, status: int
) -> None:
    body = {"model": f"chaos:fault={fault}", "messages": MESSAGES, "stream": True}
    direct = httpx2.post(chaos.base_url + "/chat/completions", json=body)
    through = post(gateway, json=body)
    assert (through.status_code, through.content) == (status, direct.content)
    assert len(chaos.requests) == 2  # one each: 4xx are never retried


def test_unreachable_upstream_is_502() -> None:
    with running_gateway(gateway_config(f"http://127.0.0.1:{free_port()}/v1")) as gateway:
        response = post(gateway, json={"model": "m", "messages": MESSAGES, "stream": True})
    assert_openai_error(response, 502, "upstream_unavailable")


def test_upstream_without_first_byte_in_time_is_504(chaos: ChaosUpstream) -> None:
    config = gateway_config(chaos.base_url, upstream={"timeouts": {"first_byte": 0.3}})
    with running_gateway(config) as gateway:
        response = post(gateway, json={"model": "chaos:first_byte_ms=2000", "messages": MESSAGES})
        assert_openai_error(response, 504, "upstream_timeout")
        assert httpx2.get(gateway.url + "/healthz").status_code == 200


def test_reset_before_the_response_is_502(gateway: RunningGateway) -> None:
    body = {"model": "chaos:fault=reset_before", "messages": MESSAGES, "stream": True}
    assert_openai_error(post(gateway, json=body), 502, "upstream_unavailable")


def test_unknown_path_and_wrong_method_are_openai_shaped(gateway: RunningGateway) -> None:
    assert_openai_error(httpx2.get(gateway.url + "/nope"), 404)
    assert_openai_error(httpx2.post(gateway.url + "/healthz"), 405)


class TestGatewayKeys:
    @pytest.fixture
    def keyed(self, chaos: ChaosUpstream) -> Iterator[RunningGateway]:
        config = gateway_config(
            chaos.base_url,
            auth={"keys": ["gw-key-one", "gw-key-two"]},
            upstream={"api_key": "sk-upstream-secret"},
        )
        with running_gateway(config) as running:
            yield running

    @pytest.mark.parametrize("header", [None, "Bearer wrong", "gw-key-one", "Basic gw-key-one"])
    def test_bad_or_missing_key_is_401(self, keyed: RunningGateway, header: str | None) -> None:
        headers = {"authorization": header} if header else {}
        body = {"model": "chaos", "messages": MESSAGES}
        assert_openai_error(post(keyed, json=body, headers=headers), 401, "invalid_api_key")

    def test_good_key_is_accepted_and_never_forwarded(
        self, keyed: RunningGateway, chaos: ChaosUpstream
    ) -> None:
        chaos.requests.clear()
        with OpenAI(base_url=keyed.base_url, api_key="gw-key-two", max_retries=0) as client:
            completion = client.chat.completions.create(model="chaos:text=3", messages=MESSAGES)  # type: ignore[arg-type]
        assert completion.choices[0].message.content
        assert chaos.requests[-1].headers["authorization"] == "Bearer sk-upstream-secret"


def test_client_key_passes_through_when_the_upstream_has_none(
    client: OpenAI, chaos: ChaosUpstream
) -> None:
    client.chat.completions.create(model="chaos:text=2", messages=MESSAGES)  # type: ignore[arg-type]
    assert chaos.requests[-1].headers["authorization"] == "Bearer sk-test-client"

"""No retry storms: an error the gateway already retried tells the client not to retry.

The openai SDK keeps its default retries (max_retries=2) here: if it retried, the
upstream would see three times the gateway's attempts.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream
from tests.api.streams import MESSAGES
from tests.servers import free_port, gateway_config, running_gateway

RETRY = {"retries": 2, "backoff_initial": 0.01, "backoff_max": 0.05, "retry_after_max": 0}


def create(client: OpenAI, model: str, stream: bool) -> None:
    if stream:
        for _ in client.chat.completions.create(model=model, messages=MESSAGES, stream=True):
            pass
    else:
        client.chat.completions.create(model=model, messages=MESSAGES)


def config(base_url: str) -> Any:
    return gateway_config(base_url, routes=[{"match": "*", "upstream": "chaos", "retry": RETRY}])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("fault", "error", "retry_after"),
    [
        ("http_503", openai.InternalServerError, None),
        ("http_429_retry,retry_after=1", openai.RateLimitError, "1"),
    ],
    ids=["503", "429"],
)
def test_the_sdk_makes_no_retries_on_top_of_the_gateways(
    chaos: ChaosUpstream,
    stream: bool,
    fault: str,
    error: type[openai.APIStatusError],
    retry_after: str | None,
) -> None:
    model = f"chaos:text=5,seed={190 + stream},fault={fault}"  # every request fails
    with (
        running_gateway(config(chaos.base_url)) as gw,
        OpenAI(base_url=gw.base_url, api_key="k") as client,
    ):
        assert client.max_retries == 2
        with pytest.raises(error) as raised:
            create(client, model, stream)
    assert len(chaos.requests_for(model)) == 3  # one leg: 1 attempt + 2 retries, once
    headers = raised.value.response.headers
    assert headers["x-should-retry"] == "false"
    assert headers.get("retry-after") == retry_after


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_unreachable_upstream_gets_one_502_the_sdk_does_not_retry(stream: bool) -> None:
    with (
        running_gateway(config(f"http://127.0.0.1:{free_port()}/v1")) as gw,
        OpenAI(base_url=gw.base_url, api_key="k") as client,
    ):
        with pytest.raises(openai.InternalServerError) as raised:
            create(client, "m", stream)
        labels = {"upstream": "chaos", "leg": "0", "result": "connect_error"}
        assert gw.metrics.registry.get_sample_value("gateway_upstream_attempts_total", labels) == 3
    assert raised.value.status_code == 502
    assert raised.value.response.headers["x-should-retry"] == "false"


def test_a_4xx_the_gateway_did_not_retry_keeps_the_upstreams_headers(
    chaos: ChaosUpstream,
) -> None:
    model = "chaos:text=5,seed=192,fault=http_400"
    with (
        running_gateway(config(chaos.base_url)) as gw,
        OpenAI(base_url=gw.base_url, api_key="k") as client,
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            create(client, model, False)
    assert "x-should-retry" not in raised.value.response.headers
    assert len(chaos.requests_for(model)) == 1

"""Endpoints other than chat completions: relayed unchanged, streams streamed."""

from __future__ import annotations

import httpx2
from openai import OpenAI

from gateway.chaos import ChaosUpstream
from tests.servers import RunningGateway, gateway_config, running_gateway


def test_embeddings_pass_through(client: OpenAI, chaos: ChaosUpstream) -> None:
    result = client.embeddings.create(model="chaos", input=["a", "b"])
    assert [len(item.embedding) for item in result.data] == [8, 8]
    assert chaos.requests[-1].path == "/v1/embeddings"
    assert chaos.requests[-1].body["input"] == ["a", "b"]


def test_legacy_completions_stream_through(client: OpenAI) -> None:
    text = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(model="chaos:text=12", prompt="x", stream=True)
        if chunk.choices
    )
    whole = client.completions.create(model="chaos:text=12", prompt="x")
    assert text and text == whole.choices[0].text


def test_models_lists_the_upstream_models(client: OpenAI) -> None:
    assert "chaos" in [model.id for model in client.models.list()]


def test_models_include_routes_that_name_one_model(chaos: ChaosUpstream) -> None:
    routes = [
        {"match": "house-model", "upstream": "chaos", "model": "chaos:text=3"},
        {"match": "*", "upstream": "chaos"},
    ]
    with running_gateway(gateway_config(chaos.base_url, routes=routes)) as gateway:
        ids = [m["id"] for m in httpx2.get(gateway.base_url + "/models").json()["data"]]
    assert ids == ["chaos", "house-model"]


def test_percent_encoded_path_is_relayed_normalised(
    gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    httpx2.get(gateway.base_url + "/files/caf%c3%a9%7E?x=1")
    assert (chaos.requests[-1].path, chaos.requests[-1].query) == ("/v1/files/caf%C3%A9~", "x=1")


def test_an_encoded_slash_is_refused_with_an_openai_error(
    gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    response = httpx2.get(gateway.base_url + "/files/a%2Fb")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_path"
    assert chaos.requests == []

"""Gemini on two providers: a stream cut on the Gemini Developer API finished on Vertex AI,
and back, through the chaos upstream's two Gemini doors (their signatures differ, as
Google's do: each door refuses the other's).

Vertex signs with Google's application default credentials: a service account whose
token endpoint is the chaos upstream's (``tests/api/test_providers.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
from google.genai import types

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.chaos import gemini as chaos_gemini
from gateway.config.load import parse_config
from gateway.config.schema import GatewayConfig
from tests.api.test_gemini import check_contract, events, parts, post, sdk_for, text
from tests.api.test_providers import cloud_credentials  # noqa: F401 - the fixture
from tests.servers import FAST_RETRY, running_gateway

TIMEOUTS = {"connect": 2, "first_byte": 3, "idle": 0.5}
DOORS = {"developer": chaos_gemini.DEVELOPER, "vertex": chaos_gemini.VERTEX}


def config(chaos: ChaosUpstream, primary: str, fallback: str, fallback_model: str) -> GatewayConfig:
    root = chaos.base_url.removesuffix("/v1")
    upstreams: list[dict[str, Any]] = [
        {"name": "developer", "kind": "gemini", "base_url": root + "/v1beta", "api_key": "gk-1"},
        {
            "name": "vertex",
            "kind": "vertex",
            "protocols": ["gemini"],
            "region": "us-central1",
            "project": "chaos-project",
            "base_url": chaos.base_url,
        },
    ]
    route = {
        "match": "*",
        "upstream": primary,
        "retry": FAST_RETRY | {"retries": 0},
        "fallbacks": [{"upstream": fallback, "model": fallback_model}],
    }
    data = {"upstreams": [u | {"timeouts": TIMEOUTS} for u in upstreams], "routes": [route]}
    return parse_config(data, "test config")


@pytest.mark.parametrize(
    ("primary", "fallback"), [("developer", "vertex"), ("vertex", "developer")]
)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_gemini_stream_cut_on_one_provider_is_finished_on_the_other(
    chaos: ChaosUpstream, primary: str, fallback: str, stream: bool
) -> None:
    # Overloaded mid-answer, every time: the primary's leg is spent at once (no retry),
    # and the other provider's leg, the same model by its own name, continues it.
    seed = 700 + (primary == "vertex") * 2 + stream
    answer = f"chaos:text=40,seed={seed}"
    cut = f"{answer},fault=error,at=12"
    with running_gateway(config(chaos, primary, fallback, answer)) as gateway:
        if stream:
            chunks, error = events(post(gateway, cut))
            assert error is None
            check_contract(chunks)
            said = text(chunks)
            # The answer's signature is the finishing provider's, valid there.
            (signed,) = [p for p in parts(chunks) if "thoughtSignature" in p]
            assert chaos_gemini.signature_valid(DOORS[fallback], signed)
            assert not chaos_gemini.signature_valid(DOORS[primary], signed)
            usage = chunks[-1]["usageMetadata"]
            assert usage["promptTokenCount"] >= 22  # both legs' prompts, summed
        else:
            sdk = sdk_for(gateway)  # kept: a client closes its connections when collected
            response = sdk.models.generate_content(model=cut, contents="Tell me.")
            said = response.text or ""
    assert said == expected_answer(answer).text  # nothing lost, nothing repeated
    [first] = chaos.requests_for(cut)
    [continued] = chaos.requests_for(answer)
    vertex_path = "/publishers/google/models/"
    assert (vertex_path in first.path) == (primary == "vertex")
    assert (vertex_path in continued.path) == (fallback == "vertex")
    model_turn = continued.body["contents"][-1]
    assert model_turn["role"] == "model"  # a prefill of the text so far
    prefix = "".join(p["text"] for p in model_turn["parts"])
    assert prefix and expected_answer(answer).text.startswith(prefix)


def test_a_vertex_gemini_leg_never_gets_the_client_key(chaos: ChaosUpstream) -> None:
    answer = "chaos:text=5,seed=710"
    with running_gateway(config(chaos, "vertex", "developer", answer)) as gateway:
        sdk = sdk_for(gateway, key="client-google-key")
        options = types.GenerateContentConfig(
            http_options=types.HttpOptions(headers={"x-goog-user-project": "client-project"})
        )
        response = sdk.models.generate_content(model=answer, contents="Hi", config=options)
    assert response.text == expected_answer(answer).text
    [request] = chaos.requests_for(answer)
    assert "x-goog-api-key" not in request.headers
    assert "x-goog-user-project" not in request.headers
    assert request.headers["authorization"].startswith("Bearer ")

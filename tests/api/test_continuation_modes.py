"""Continuation is a property of the model: per leg, per model glob, and learned from a 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.config.load import parse_config
from gateway.upstream.continuation import learned_continuation
from gateway.upstream.routes import Router
from tests.api.streams import stream_chat
from tests.servers import RunningGateway, gateway_config, running_gateway

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.02, "idle_retry_delay": 0.01}


def test_a_legs_mode_wins_then_the_models_glob_then_the_upstreams_default() -> None:
    config = parse_config(
        {
            "upstreams": [
                {
                    "name": "up",
                    "base_url": "http://u/v1",
                    "continuation": "prefix",
                    "continuation_models": {"claude-*": "prompt", "mistral-*": "prefix_echo"},
                }
            ],
            "routes": [
                {"match": "pinned", "upstream": "up", "continuation": "vllm"},
                {"match": "*", "upstream": "up"},
            ],
        },
        "test",
    )
    router = Router(config)
    modes = {
        model: router.resolve(model).legs[0].continuation
        for model in ("pinned", "claude-4.6", "mistral-large", "deepseek-chat")
    }
    assert modes == {
        "pinned": "vllm",
        "claude-4.6": "prompt",
        "mistral-large": "prefix_echo",
        "deepseek-chat": "prefix",
    }


@pytest.fixture
def prefix_gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    # One upstream entry that continues by prefix, as a user would write it; the model
    # behind it refuses a trailing assistant message (chaos prefill=0).
    route = {"match": "*", "upstream": "chaos", "model": "claude-like", "retry": FAST_RETRY}
    config = gateway_config(chaos.base_url, upstream={"continuation": "prefix"}, routes=[route])
    with running_gateway(config) as gateway:
        yield gateway


def chat(gateway: RunningGateway, spec: str) -> str:
    # The spec travels in x-chaos (an end-to-end header), so the model name the gateway
    # remembers stays "claude-like" across runs.
    with OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client:
        return stream_chat(client, "any", extra_headers={"x-chaos": spec}).text


def requests_with(chaos: ChaosUpstream, spec: str) -> list[Any]:
    return [r for r in list(chaos.requests) if r.headers.get("x-chaos") == spec]


def test_a_refused_prefill_is_continued_in_prompt_mode_and_remembered(
    prefix_gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    first = "chaos:text=30,seed=71,prefill=0,fault=reset,at=8,times=1"
    assert chat(prefix_gateway, first) == expected_answer(first).text
    sent = requests_with(chaos, first)
    # The original, the prefix continuation refused with a 400, the prompt continuation.
    assert [r.body["messages"][-1]["role"] for r in sent] == ["user", "assistant", "user"]
    registry = prefix_gateway.metrics.registry
    refused = {"upstream": "chaos", "mode": "prefix"}
    assert registry.get_sample_value("gateway_continuation_prefill_refused_total", refused) == 1

    # The next run of the same model goes straight to prompt mode.
    second = "chaos:text=30,seed=72,prefill=0,fault=reset,at=8,times=1"
    assert chat(prefix_gateway, second) == expected_answer(second).text
    assert [r.body["messages"][-1]["role"] for r in requests_with(chaos, second)] == [
        "user",
        "user",
    ]
    assert registry.get_sample_value("gateway_continuation_prefill_refused_total", refused) == 1


def test_a_model_that_takes_prefill_keeps_its_mode(
    prefix_gateway: RunningGateway, chaos: ChaosUpstream
) -> None:
    spec = "chaos:text=30,seed=73,fault=reset,at=8,times=1"
    assert chat(prefix_gateway, spec) == expected_answer(spec).text
    continuation = requests_with(chaos, spec)[-1].body["messages"][-1]
    assert continuation["role"] == "assistant" and continuation["prefix"] is True


def test_replay_mode_asks_the_same_request_again_and_keeps_it_once_verified(
    chaos: ChaosUpstream,
) -> None:
    # continuation: replay never sends a continuation: the request again, its text cut
    # where it has repeated everything the client has (exact on a deterministic server).
    route = {"match": "*", "upstream": "chaos", "retry": FAST_RETRY}
    config = gateway_config(chaos.base_url, upstream={"continuation": "replay"}, routes=[route])
    model = "chaos:text=40,seed=461,fault=reset,at=12,times=1"
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client,
    ):
        assert stream_chat(client, model, max_tokens=30).text == expected_answer(model).text
        first, replay = chaos.requests_for(model)
        assert replay.body == first.body  # its whole budget: it ends where the first would


@pytest.mark.parametrize(
    ("owned_by", "mode"),
    [("llamacpp", "vllm"), ("vllm", "vllm"), ("sglang", "vllm"), ("system", "prompt")],
)
def test_auto_learns_a_literal_prefill_from_the_servers_own_model_list(
    owned_by: str, mode: str
) -> None:
    models = orjson.dumps({"data": [{"id": "m", "owned_by": owned_by}]})
    assert learned_continuation(models, "m")[0] == mode
    # llama.cpp answers any model name with the one it loaded: the server's owner.
    assert learned_continuation(models, "another name")[0] == mode


@pytest.mark.parametrize("answer", [b"", b"<html>", b'{"data": 3}', b'{"data": []}', b"[]"])
def test_auto_falls_back_to_prompt_on_any_other_answer(answer: bytes) -> None:
    assert learned_continuation(answer, "m")[0] == "prompt"


def test_auto_on_the_chaos_upstream_asks_once_and_continues_in_prompt_mode(
    chaos: ChaosUpstream,
) -> None:
    # The chaos upstream's model list says owned_by "chaos": prompt mode, learned once
    # for the model (two runs of it, each recovered: the spec goes in x-chaos).
    route = {"match": "*", "upstream": "chaos", "retry": FAST_RETRY}
    config = gateway_config(chaos.base_url, upstream={"continuation": "auto"}, routes=[route])
    specs = [f"chaos:text=30,seed={462 + i},fault=reset,at=8,times=1" for i in range(2)]
    chaos.requests.clear()
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client,
    ):
        for spec in specs:
            received = stream_chat(client, "auto-model", extra_headers={"x-chaos": spec})
            assert received.text == expected_answer(spec).text
            continuation = chaos.requests[-1].body["messages"][-1]
            assert continuation["role"] == "user"  # the prompt-mode ask
    assert [r.path for r in chaos.requests].count("/v1/models") == 1

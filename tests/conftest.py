from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, running_chaos_upstream
from tests.servers import RunningGateway, gateway_config, running_gateway

# Upstreams are reached through the environment's proxy (docs/configuration.md,
# "Networks"): one set on the machine running the tests must not carry the suite's
# loopback traffic (the gateways in this process and the replica processes it starts
# read this environment).
for _name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
    os.environ.pop(_name, None)
    os.environ.pop(_name.upper(), None)


@pytest.fixture(scope="session")
def chaos() -> Iterator[ChaosUpstream]:
    with running_chaos_upstream() as upstream:
        yield upstream


@pytest.fixture
def gateway(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    chaos.requests.clear()
    with running_gateway(gateway_config(chaos.base_url)) as running:
        yield running


@pytest.fixture
def client(gateway: RunningGateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=gateway.base_url, api_key="sk-test-client", max_retries=0) as openai:
        yield openai

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, running_chaos_upstream
from tests.servers import RunningGateway, gateway_config, running_gateway


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

"""A recovering gateway in front of the chaos upstream and an openai SDK client on it,
for the modules that speak OpenAI's dialects; one that speaks another (Messages, Gemini)
defines its own ``recovering`` and ``sdk``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream
from tests.servers import RunningGateway, recovering_config, running_gateway


@pytest.fixture(scope="module")
def recovering(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(recovering_config(chaos.base_url)) as running:
        yield running


@pytest.fixture
def sdk(recovering: RunningGateway) -> Iterator[OpenAI]:
    with OpenAI(base_url=recovering.base_url, api_key="k", max_retries=0) as client:
        yield client

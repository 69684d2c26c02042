from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from gateway.chaos import ChaosUpstream, running_chaos_upstream


@pytest.fixture
def upstream() -> Iterator[ChaosUpstream]:
    with running_chaos_upstream() as upstream:
        yield upstream


@pytest.fixture
def client(upstream: ChaosUpstream) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=upstream.base_url, timeout=10) as client:
        yield client

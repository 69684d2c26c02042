"""The upstream client's pools, against a real chaos upstream."""

from __future__ import annotations

import asyncio

import httpx

from gateway.chaos import running_chaos_upstream
from gateway.config import Limits
from gateway.upstream.client import POOL_STREAMS, UpstreamClient
from gateway.upstream.routes import ResolvedLeg
from tests.servers import gateway_config


async def _burst(client: UpstreamClient, leg: ResolvedLeg, streams: int) -> list[httpx.Response]:
    body = b'{"model": "chaos:text=3", "messages": [], "stream": true}'
    return await asyncio.gather(
        *(client.open_stream(leg, body, None, idle_timeout=2) for _ in range(streams))
    )


def test_a_burst_spreads_over_small_pools_and_a_quiet_client_uses_one() -> None:
    async def scenario(base_url: str) -> None:
        upstream = gateway_config(base_url).upstreams[0]
        leg = ResolvedLeg(upstream, "chaos:text=3")
        client = UpstreamClient([upstream], Limits())
        try:
            responses = await _burst(client, leg, 3 * POOL_STREAMS)
            # Each pool took its share while the others were busy: no pool's scan grows.
            assert [pool.open for pool in client._pools] == [POOL_STREAMS] * 3
            for response in responses:
                await response.aread()
            assert [pool.open for pool in client._pools] == [0, 0, 0]
            # Quiet again: one stream after another all go to the first pool.
            for _ in range(3):
                (response,) = await _burst(client, leg, 1)
                assert client._pools[0].open == 1
                await response.aread()
        finally:
            await client.aclose()

    with running_chaos_upstream() as chaos:
        asyncio.run(scenario(chaos.base_url))

"""Many concurrent streams through one gateway process (correctness, not timing)."""

from __future__ import annotations

import asyncio

import httpx2
from openai import AsyncOpenAI

from gateway.chaos import expected_answer
from tests.servers import RunningGateway

STREAMS = 200


def test_200_concurrent_paced_streams_complete_exactly(gateway: RunningGateway) -> None:
    # Paced deltas keep all 200 streams open at once, as real LLM streams are, for
    # longer than the upstream pool timeout (2 s): with httpx's default pool of 100
    # connections the 101st stream would fail instead of waiting.
    models = [f"chaos:text=100,pace_ms=25,seed={i}" for i in range(STREAMS)]

    async def one(client: AsyncOpenAI, model: str) -> str:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def main() -> list[str]:
        # The SDK's own pool allows 1,000 connections: no stream waits for another.
        async with AsyncOpenAI(
            base_url=gateway.base_url, api_key="k", max_retries=0, timeout=60
        ) as client:
            return await asyncio.gather(*(one(client, m) for m in models))

    texts = asyncio.run(main())
    assert texts == [expected_answer(m).text for m in models]
    text = httpx2.get(gateway.url + "/metrics").text
    assert f'gateway_requests_total{{method="POST",route="*",status="200"}} {STREAMS}.0' in text

"""SIGTERM to a gateway process that is serving a stream: what its client gets.

Within ``listen.drain_timeout`` the stream simply finishes. Past it, the run is
checkpointed and the client gets a ``gateway_shutting_down`` error event that
says how to resume; another replica then serves the rest, whole.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import openai
import orjson
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import Received, assert_whole_text_answer, receive, resume, start
from tests.processes import DEADLINE, Replica, Replicas, wait_until
from tests.redis_server import RedisServer, running_redis

CONFIG = """
upstreams:
  - name: chaos
    base_url: {chaos}
listen:
  drain_timeout: {drain}
state:
  store: {store}
  redis_url: {redis}
"""


def replicas_with(
    tmp_path: Path, chaos: ChaosUpstream, *, drain: float, redis: str | None = None
) -> Replicas:
    config = tmp_path / "gateway.yaml"
    store = "redis" if redis else "memory"
    text = CONFIG.format(chaos=chaos.base_url, drain=drain, store=store, redis=redis or "null")
    config.write_text(text)
    return Replicas(config, tmp_path)


def sdk(replica: Replica) -> OpenAI:
    return OpenAI(base_url=replica.base_url, api_key="sk-test", max_retries=0, timeout=DEADLINE)


def refuses_connections(replica: Replica) -> bool:
    try:
        httpx2.get(replica.url + "/healthz", timeout=1)
    except httpx2.ConnectError:
        return True
    except httpx2.TransportError:
        return False  # accepted into the backlog as the listener closed: ask again
    return False


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def test_sigterm_lets_a_running_stream_finish(chaos: ChaosUpstream, tmp_path: Path) -> None:
    model = "chaos:text=40,seed=61,pace_ms=50"  # about 2 s
    with replicas_with(tmp_path, chaos, drain=20) as replicas:
        [replica] = replicas.start("a")
        received = Received()
        with sdk(replica) as client:
            _, stream = start(client, model, received, chunks=5)
            replica.terminate()
            wait_until(lambda: refuses_connections(replica), "no new connections")
            with stream:
                receive(stream, received)
        assert_whole_text_answer(received, model)
        replica.process.wait(DEADLINE)  # and then it exits, well before its drain timeout


def test_past_the_drain_timeout_another_replica_finishes_the_run(
    chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    model = "chaos:text=60,seed=62,pace_ms=100"  # about 6 s: longer than the drain
    with replicas_with(tmp_path, chaos, drain=1, redis=redis_server.url) as replicas:
        a, b = replicas.start("a", "b")
        received = Received()
        with sdk(a) as client:
            run_id, stream = start(client, model, received, chunks=5)
            terminated = time.monotonic()
            a.terminate()
            with stream, pytest.raises(openai.APIError) as ended:
                receive(stream, received)
        drained_after = time.monotonic() - terminated
        assert ended.value.code == "gateway_shutting_down"
        assert f"x-run-id: {run_id}" in ended.value.message
        assert 1 <= drained_after < 3  # the drain timeout, not the answer's length
        assert 5 < received.chunks and not received.finish_reasons
        a.process.wait(DEADLINE)

        with sdk(b) as client:
            resume(client, model, run_id, received)
        assert_whole_text_answer(received, model)
        assert b.resumed("takeover") == 1


def test_without_a_shared_store_the_client_is_told_the_answer_is_incomplete(
    chaos: ChaosUpstream, tmp_path: Path
) -> None:
    model = "chaos:text=60,seed=63,pace_ms=100"
    with replicas_with(tmp_path, chaos, drain=1) as replicas:
        [replica] = replicas.start("a")
        received = Received()
        with sdk(replica) as client:
            _, stream = start(client, model, received, chunks=5)
            replica.terminate()
            with stream, pytest.raises(openai.APIError) as ended:
                receive(stream, received)
        assert ended.value.code == "gateway_shutting_down"
        assert "the answer is incomplete" in ended.value.message
        assert "x-run-id" not in ended.value.message  # nothing to resume it from


def test_an_event_stream_follower_also_gets_the_whole_drain(
    chaos: ChaosUpstream, tmp_path: Path
) -> None:
    """``GET /v1/runs/{id}/events`` (sse-starlette) is not cut at SIGTERM either."""
    model = "chaos:text=40,seed=64,pace_ms=50"  # about 2 s
    with replicas_with(tmp_path, chaos, drain=20) as replicas:
        [replica] = replicas.start("a")
        received = Received()
        text = ""
        with sdk(replica) as client:
            run_id, stream = start(client, model, received, chunks=3)
            url = f"{replica.url}/v1/runs/{run_id}/events"
            with (
                httpx2.Client(timeout=DEADLINE) as http,
                http.sse(url, headers={"authorization": "Bearer sk-test"}) as events,
            ):
                replica.terminate()
                for event in events:
                    if event.data == "[DONE]":
                        break
                    for choice in orjson.loads(event.data)["choices"]:
                        text += choice["delta"].get("content") or ""
            stream.close()
        assert text == expected_answer(model).text


def test_a_request_still_opening_its_run_at_the_deadline_is_handed_over(
    chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    """SIGTERM while the upstream has not answered yet: the drain waits for it, and
    the run it starts after the deadline is checkpointed at once for another replica."""
    model = "chaos:text=20,seed=65,first_byte_ms=1500,pace_ms=20"
    with replicas_with(tmp_path, chaos, drain=1, redis=redis_server.url) as replicas:
        a, b = replicas.start("a", "b")
        received = Received()
        with sdk(a) as client, ThreadPoolExecutor(1) as pool:
            # The SDK returns at the response headers, after the upstream's first byte.
            opening = pool.submit(start_or_end, client, model, received)
            wait_until(lambda: len(chaos.requests_for(model)) == 1, "the upstream request")
            a.terminate()
            run_id, ended = opening.result(DEADLINE)
        assert ended is not None and ended.code == "gateway_shutting_down"
        a.process.wait(DEADLINE)
        with sdk(b) as client:
            resume(client, model, run_id, received)
        assert_whole_text_answer(received, model)


def start_or_end(client: OpenAI, model: str, into: Received) -> tuple[str, openai.APIError | None]:
    """Read a stream to its end; its run id, and the error event that ended it, if any."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    try:
        with raw.parse() as stream:
            receive(stream, into)
    except openai.APIError as exc:
        return raw.headers["x-run-id"], exc
    return raw.headers["x-run-id"], None

"""Checkpoints in a real Redis: what they hold, their TTLs, and a Redis that dies.

The gateway runs in-process (uvicorn on a free port); Redis is the test's own
(``tests.redis_server``), so it can be killed and restarted mid-stream.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest
import redis

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.checkpoint.model import Checkpoint, RunRecord, RunState
from gateway.checkpoint.redis import RedisStore
from gateway.protocols import CHAT
from tests.api.streams import MESSAGES
from tests.redis_server import RedisServer, running_redis
from tests.servers import RunningGateway, gateway_config, running_gateway, wait_for

KEY = "sk-checkpoint-owner-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}
SLOW_RETRY = {"retries": 2, "backoff_initial": 1.5, "backoff_max": 1.5}


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def durable_gateway(chaos: ChaosUpstream, redis_server: RedisServer, **state: Any) -> Any:
    return running_gateway(
        gateway_config(
            chaos.base_url,
            upstream={"timeouts": {"connect": 2, "first_byte": 5, "idle": 1}},
            routes=[{"match": "*", "upstream": "chaos", "retry": SLOW_RETRY}],
            state={"redis_url": redis_server.url, "checkpoint_every": 4} | state,
        )
    )


def load(url: str, run_id: str) -> Checkpoint | None:
    async def go() -> Checkpoint | None:
        store = RedisStore(url)
        try:
            return await store.load(run_id)
        finally:
            await store.aclose()

    return asyncio.run(go())


def read_events(response: httpx2.Response, count: int) -> list[str]:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:])
            if len(out) == count:
                break
    return out


def content(events: list[str]) -> str:
    chunks = [orjson.loads(e) for e in events if e != "[DONE]"]
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


def stream(gateway: RunningGateway, model: str) -> Any:
    body = {"model": model, "messages": MESSAGES, "stream": True}
    return httpx2.stream(
        "POST", gateway.base_url + "/chat/completions", json=body, headers=AUTH, timeout=30
    )


def everything_stored(r: redis.Redis) -> bytes:
    client: Any = r  # redis-py's sync stubs type every reply as a union
    out = []
    for key in client.keys("rg:*"):
        if client.type(key) == b"stream":
            out += [value for _, fields in client.xrange(key) for value in fields.values()]
        else:
            out.append(client.get(key))
    return b"".join(out)


def test_a_checkpoint_every_four_content_deltas_holds_what_the_client_has(
    chaos: ChaosUpstream, redis_server: RedisServer, r: redis.Redis
) -> None:
    model = "chaos:text=40,seed=21,pace_ms=150"
    answer = expected_answer(model)
    with durable_gateway(chaos, redis_server) as gateway, stream(gateway, model) as response:
        run_id = response.headers["x-run-id"]
        events = read_events(response, 1 + 8)  # the role, then 8 content deltas
        # Checkpointed after the 8th content delta, long before the 9th is due.
        checkpoint = wait_for(
            lambda: (c := load(redis_server.url, run_id)) and c.state.seq >= 9 and c
        )
        assert checkpoint.state.seq == 9
        assert checkpoint.state.status == "running"
        assert CHAT.replay(checkpoint.events).text == content(events)
        assert answer.text.startswith(CHAT.replay(checkpoint.events).text)
        assert checkpoint.state.text_chars == len(content(events))
        assert checkpoint.record.body == {"model": model, "messages": MESSAGES, "stream": True}
        assert checkpoint.record.owner != KEY and len(checkpoint.record.owner) == 64
        # TTLs: the run's keys expire (default 3600 s), the lease in lease_ttl (5 s).
        tag = f"rg:{{{run_id}}}:"
        for key in ("record", "events", "state"):
            assert 3_500_000 < r.pttl(tag + key) <= 3_600_000
        assert 0 < r.pttl(tag + "lease") <= 5_000
        # No credential anywhere in the store.
        assert KEY.encode() not in everything_stored(r)


def test_the_in_memory_store_gets_the_last_checkpoint_only(chaos: ChaosUpstream) -> None:
    # No other process reads it, and a live run's followers read its log: checkpoints
    # before the last would be copies nobody reads (BENCHMARKS.md: 16% of the CPU),
    # and their lease heartbeats stalled every stream at once.
    model = "chaos:text=40,seed=24,pace_ms=5,fault=reset,at=10,times=1"
    with running_gateway(gateway_config(chaos.base_url)) as gateway:
        with stream(gateway, model) as response:
            run_id = response.headers["x-run-id"]
            events = read_events(response, 1000)
        writes = gateway.metrics.registry.get_sample_value
        wait_for(lambda: writes("gateway_checkpoint_writes_total", {"result": "ok"}) == 1)
        # The last one holds the whole answer: a late resume replays it.
        resumed = httpx2.post(
            gateway.base_url + "/chat/completions",
            json={},
            headers=AUTH | {"x-run-id": run_id, "x-resume-from": "1"},
        )
        replayed = [line[6:] for line in resumed.text.splitlines() if line.startswith("data: ")]
        assert replayed == events[1:]
        assert content(events) == expected_answer(model).text
        assert writes("gateway_checkpoint_writes_total", {"result": "ok"}) == 1


def test_an_interruption_is_checkpointed_with_the_call_in_flight(
    chaos: ChaosUpstream, redis_server: RedisServer
) -> None:
    # 5 text deltas, then tool calls whose argument deltas break mid-way (at=9).
    model = "chaos:text=5,tools=2,arg_deltas=6,seed=22,fault=reset,at=9,times=1"
    answer = expected_answer(model)
    with durable_gateway(chaos, redis_server) as gateway, stream(gateway, model) as response:
        run_id = response.headers["x-run-id"]
        # During the 1.5 s backoff: the checkpoint written on the interruption.
        checkpoint = wait_for(
            lambda: (c := load(redis_server.url, run_id)) and c.state.cause and c, timeout=1.4
        )
        state = checkpoint.state
        assert state.cause == "reset"
        assert CHAT.replay(checkpoint.events).text == answer.text
        [call] = state.in_flight
        assert call.name == answer.tool_calls[0].name
        assert answer.tool_calls[0].arguments.startswith(call.arguments)
        assert 0 < len(call.arguments) < len(answer.tool_calls[0].arguments)
        assert state.tool_calls == 0  # never sent: held until complete
        rest = read_events(response, 1000)
        assert rest[-1] == "[DONE]"


def test_a_completed_run_is_kept_briefly_or_deleted(
    chaos: ChaosUpstream, redis_server: RedisServer, r: redis.Redis
) -> None:
    model = "chaos:text=10,seed=23"
    with durable_gateway(chaos, redis_server) as gateway:
        with stream(gateway, model) as response:
            run_id = response.headers["x-run-id"]
            assert read_events(response, 1000)[-1] == "[DONE]"
        checkpoint = wait_for(
            lambda: (c := load(redis_server.url, run_id)) and c.state.status == "done" and c
        )
        assert CHAT.replay(checkpoint.events).text == expected_answer(model).text
        assert CHAT.is_terminal(checkpoint.events[-1])
        tag = f"rg:{{{run_id}}}:"
        assert 0 < r.pttl(tag + "state") <= 60_000  # completed_ttl
        assert not r.exists(tag + "lease")
    with durable_gateway(chaos, redis_server, completed_ttl=0) as gateway:
        with stream(gateway, model) as response:
            run_id = response.headers["x-run-id"]
            assert read_events(response, 1000)[-1] == "[DONE]"
        wait_for(lambda: not r.keys(f"rg:{{{run_id}}}:*"))


def test_streams_survive_redis_dying_and_checkpoints_resume_when_it_returns(
    chaos: ChaosUpstream, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    models = [f"chaos:text=50,seed={30 + i},pace_ms=40" for i in range(4)]
    results: dict[str, list[str]] = {}
    run_ids: dict[str, str] = {}

    def client(gateway: RunningGateway, model: str) -> None:
        with stream(gateway, model) as response:
            run_ids[model] = response.headers["x-run-id"]
            results[model] = read_events(response, 10_000)

    def sample(gateway: RunningGateway, result: str) -> float:
        value = gateway.metrics.registry.get_sample_value(
            "gateway_checkpoint_writes_total", {"result": result}
        )
        return value or 0.0

    with (
        caplog.at_level(logging.WARNING, logger="gateway.checkpoint"),
        durable_gateway(chaos, redis_server) as gateway,
    ):
        threads = [threading.Thread(target=client, args=(gateway, m)) for m in models]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(run_ids) == len(models) and sample(gateway, "ok") >= 8)
        redis_server.stop()
        wait_for(lambda: sample(gateway, "error") > 0)
        assert httpx2.get(gateway.url + "/readyz").status_code == 503
        time.sleep(0.4)  # streams go on meanwhile, unprotected
        redis_server.restart()  # empty: everything it had is gone
        ok_before = sample(gateway, "ok")
        wait_for(lambda: sample(gateway, "ok") > ok_before)
        assert httpx2.get(gateway.url + "/readyz").status_code == 200
        # Rewritten whole after the outage: the log from event 1, not only what is new.
        some = models[0]
        checkpoint = wait_for(lambda: load(redis_server.url, run_ids[some]))
        assert checkpoint.events and checkpoint.state.seq == len(checkpoint.events)
        assert expected_answer(some).text.startswith(CHAT.replay(checkpoint.events).text)
        for thread in threads:
            thread.join(30)
    for model in models:
        assert results[model][-1] == "[DONE]"
        assert content(results[model]) == expected_answer(model).text
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "gateway.checkpoint"]
    assert len([w for w in warnings if "unavailable" in w]) == 1  # one per outage
    assert len([w for w in warnings if "reachable again" in w]) == 1


def test_a_record_or_state_from_a_later_version_is_read() -> None:
    """A rolling update: fields a later version adds are left out, not a failure."""
    record = RunRecord("r", "owner", "*", {"model": "m"}, 1.0, "chat", "?beta=true")
    later = orjson.loads(record.encode()) | {"added_later": 1}
    assert RunRecord.decode(orjson.dumps(later)) == record
    state = RunState(seq=3, status="running", leg=0, splice_leg=0)
    later = orjson.loads(state.encode()) | {"added_later": {"x": 1}}
    assert RunState.decode(orjson.dumps(later)) == state

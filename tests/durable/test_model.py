"""Pure parts of durable runs: the client view rebuilt from events, owner hashes,
and the in-memory store's TTL, lease and claim semantics."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from gateway.checkpoint.connect import connect
from gateway.checkpoint.model import (
    Flush,
    InFlightCall,
    RunRecord,
    RunState,
    owner_hash,
    split_events,
)
from gateway.checkpoint.store import MemoryStore
from gateway.config.load import parse_config
from gateway.config.schema import ConfigError
from gateway.protocols import CHAT


def event(delta: dict[str, object], finish: str | None = None) -> bytes:
    chunk = {
        "id": "c1",
        "created": 1,
        "model": "m",
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def test_replay_rebuilds_what_the_client_assembled() -> None:
    call = {"index": 0, "id": "call_a", "type": "function",
            "function": {"name": "f", "arguments": '{"x": 1}'}}  # fmt: skip
    events = [
        event({"role": "assistant", "content": ""}),
        event({"reasoning_content": "think "}),
        event({"content": "héllo "}),
        event({"content": "👩‍💻"}),
        event({"tool_calls": [call]}),
        event({}, "tool_calls"),
        b"data: [DONE]\n\n",
    ]
    accumulator = CHAT.replay(split_events(b"".join(events)))
    assert accumulator.identity == {"id": "c1", "created": 1, "model": "m",
                                    "system_fingerprint": None}  # fmt: skip
    assert accumulator.role == "assistant"
    assert accumulator.text == "héllo 👩‍💻" and accumulator.text_chars == 9
    assert accumulator.reasoning == "think "
    assert [c.as_delta() for c in accumulator.tool_calls] == [call]
    assert accumulator.finish_reason == "tool_calls"
    assert CHAT.is_terminal(events[-1]) and not CHAT.is_terminal(events[-2])
    assert CHAT.is_terminal(b'data: {"error": {"message": "x"}}\n\n')


def test_owner_hash_is_keyed_and_never_the_credential() -> None:
    a = owner_hash(b"key-1", "Bearer sk-secret")
    assert a == owner_hash(b"key-1", "Bearer sk-secret")
    assert a != owner_hash(b"key-2", "Bearer sk-secret")
    assert a != owner_hash(b"key-1", "Bearer sk-other")
    assert "sk-secret" not in a and len(a) == 64
    assert owner_hash(b"k", None) == owner_hash(b"k", "")


def test_state_and_record_round_trip() -> None:
    state = RunState(seq=3, status="running", leg=1, splice_leg=2,
                     usage_by_leg={"0": {"total_tokens": 5}},
                     in_flight=[InFlightCall("f", '{"a"')], cause="reset")  # fmt: skip
    assert RunState.decode(state.encode()) == state
    record = RunRecord("r", "o" * 64, "*", {"model": "m", "messages": []}, 1.5)
    assert RunRecord.decode(record.encode()) == record


def flush(run_id: str, first: int, events: list[bytes], **kwargs: object) -> Flush:
    state = RunState(seq=first + len(events) - 1, status="running", leg=0, splice_leg=0)
    record = RunRecord(run_id, "o", "*", {}, 0.0).encode()
    return Flush(run_id, first, b"".join(events), first + len(events) - 1, state.encode(),
                 record, **kwargs)  # type: ignore[arg-type]  # fmt: skip


def test_memory_store_keeps_ttl_lease_and_claim_semantics() -> None:
    async def go() -> None:
        store = MemoryStore()
        e = [event({"content": str(i)}) for i in range(6)]
        await store.write([flush("a", 1, e[:4], lease="r1", lease_ttl=0.2, ttl=0.5)])
        await store.write([flush("a", 5, e[4:], lease="r1", lease_ttl=0.2, ttl=0.5)])
        loaded = await store.load("a")
        assert loaded is not None and loaded.events == e
        assert [s for s, _ in await store.read_events("a", 4)] == [5, 6]
        # Held: nobody can claim it; expired: exactly one claimant wins, with epoch 1.
        assert await store.claim("a", "r2", 1) is None
        await asyncio.sleep(0.25)
        assert await store.lease_holder("a") is None
        wins = await asyncio.gather(*(store.claim("a", f"r{i}", 1) for i in range(5)))
        assert sorted(wins, key=str) == [1, None, None, None, None]
        await asyncio.sleep(0.3)  # past the run's TTL: gone
        assert await store.load("a") is None
        # A blocking read wakes up on the write it waits for.
        waiter = asyncio.ensure_future(store.read_events("b", 0, block=2))
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await store.write([flush("b", 1, e[:1])])
        assert [s for s, _ in await waiter] == [1]
        assert time.monotonic() - started < 0.5

    asyncio.run(go())


def test_memory_store_keeps_a_finished_log_compressed_and_whole() -> None:
    # Finished runs stay for completed_ttl, thousands of them at load: their logs are
    # kept as one compressed blob, and read back (or grown by a takeover) whole.
    async def go() -> None:
        store = MemoryStore()
        e = [event({"content": f"word {i} "}) for i in range(40)]
        await store.write([flush("a", 1, e[:30])])  # detached at 30: the lease released
        held = store.memory_bytes("a")
        assert held < len(b"".join(e[:30])) / 4
        loaded = await store.load("a")
        assert loaded is not None and loaded.events == e[:30]
        assert [s for s, _ in await store.read_events("a", 28)] == [29, 30]
        # Taken over: the new owner's checkpoints extend the log.
        await store.write([flush("a", 31, e[30:], lease="r2")])
        loaded = await store.load("a")
        assert loaded is not None and loaded.events == e

    asyncio.run(go())


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:1/0", "Redis"),
        ("rediss://127.0.0.1:1/0", "Redis"),
        ("redis+cluster://127.0.0.1:1", "RedisCluster"),
        ("redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26380/mymaster/2", "Redis"),
    ],
)
def test_every_documented_redis_url_makes_a_client(url: str, kind: str) -> None:
    async def go() -> None:
        client = connect(url, 8)
        assert type(client).__name__ == kind
        if url.startswith("redis+sentinel"):
            pool = client.connection_pool
            assert pool.service_name == "mymaster"
            assert pool.connection_kwargs["db"] == 2
        await client.aclose()

    asyncio.run(go())


def test_state_config_is_validated() -> None:
    upstreams = [{"name": "u", "base_url": "http://x/v1"}]
    with pytest.raises(ConfigError, match="store: redis needs a redis_url"):
        parse_config({"upstreams": upstreams, "state": {"store": "redis"}})
    with pytest.raises(ConfigError, match="state.redis_url"):
        parse_config({"upstreams": upstreams, "state": {"redis_url": "http://x"}})
    config = parse_config({"upstreams": upstreams, "state": {"redis_url": "redis://r:6379"}})
    assert config.state.backend == "redis"
    assert parse_config({"upstreams": upstreams}).state.backend == "memory"
    # A bare `store: off` in YAML arrives as False.
    assert parse_config({"upstreams": upstreams, "state": {"store": False}}).state.backend == "off"

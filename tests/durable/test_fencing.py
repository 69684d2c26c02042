"""Lease fencing: a replica paused past its lease cannot overwrite a run another
replica took over.

Replica A holds run R; A stops renewing its lease (a long GC pause, SIGSTOP); the
lease lapses, replica B claims R and writes it; then A wakes up and writes R. A's
write must be refused and R must stay B's. First at the store (a real Redis,
standalone and Cluster, and the in-memory store, which must behave the same), then
the writer, then real gateway processes, where A is frozen with SIGSTOP and its
client must be told to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
import redis
from redis.crc import key_slot

from gateway.chaos import ChaosUpstream
from gateway.checkpoint.model import Applied, Flush, RunRecord, RunState
from gateway.checkpoint.redis import RedisStore
from gateway.checkpoint.scripts import CLAIM_SCRIPT
from gateway.checkpoint.store import CheckpointStore, MemoryStore
from gateway.checkpoint.writer import CheckpointWriter
from gateway.metrics import Metrics
from tests.api.streams import Received, assert_whole_text_answer, receive
from tests.durable.two_replicas import resume_on, started, state
from tests.processes import Replica, Replicas, replica_config, wait_until
from tests.redis_cluster import RedisClusterNodes, running_cluster
from tests.redis_server import RedisServer

LEASE = 0.2  # seconds: A's lease, short so that the tests can let it lapse


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisClusterNodes]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(params=["memory", "redis", "cluster"])
def store_url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str | None:
    """Where the store under test lives: None for the in-memory store."""
    if request.param == "memory":
        return None
    if request.param == "redis":
        return redis_server.url
    cluster: RedisClusterNodes = request.getfixturevalue("redis_cluster")
    return cluster.url


@contextlib.asynccontextmanager
async def opened(url: str | None) -> AsyncIterator[CheckpointStore]:
    store: CheckpointStore = MemoryStore() if url is None else RedisStore(url)
    try:
        yield store
    finally:
        await store.aclose()


def event(text: str) -> bytes:
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def flush(run_id: str, writer: str, first: int, events: list[bytes], **kwargs: Any) -> Flush:
    """``writer``'s checkpoint of events ``first…``; its state says who wrote it (``cause``)."""
    last = first + len(events) - 1
    state = RunState(seq=last, status="running", leg=0, splice_leg=0, cause=writer)
    kwargs.setdefault("lease", writer)
    kwargs.setdefault("lease_ttl", LEASE)
    return Flush(run_id, first, b"".join(events), last, state.encode(), **kwargs)


def run_id() -> str:
    return "fence-" + secrets.token_hex(4)


# -- the store ---------------------------------------------------------------------------


def test_a_writer_whose_lease_was_taken_over_cannot_overwrite_the_run(
    store_url: str | None, redis_server: RedisServer
) -> None:
    a_events = [event(f"a{i} ") for i in range(8)]
    b_events = [event(f"b{i} ") for i in range(3)]

    async def go() -> None:
        async with opened(store_url) as store:
            run, other = run_id(), run_id()
            record = RunRecord(run, "owner", "*", {"model": "m"}, 0.0).encode()
            # A starts R and checkpoints events 1-4 under its lease.
            [applied] = await store.write([flush(run, "A", 1, a_events[:4], record=record)])
            assert applied is Applied.WRITTEN
            assert await store.claim(run, "B", 5) is None  # held: nobody may take it
            # A pauses: its lease lapses and B claims R (exactly one claimant wins).
            await asyncio.sleep(LEASE + 0.1)
            claims = await asyncio.gather(store.claim(run, "B", 5), store.claim(run, "C", 5))
            assert list(claims) == [1, None]
            [applied] = await store.write(
                [flush(run, "B", 5, b_events, lease_ttl=5, epoch=claims[0])]
            )
            assert applied is Applied.WRITTEN
            # A wakes up and writes R as if nothing happened: its next checkpoint, a
            # heartbeat, a whole rewrite (after an outage), and a last write that
            # releases the lease. Another run in the same batch is written as usual.
            refused = await store.write(
                [
                    flush(run, "A", 5, a_events[4:6]),
                    flush(other, "A", 1, a_events[:1], record=record),
                    flush(run, "A", 7, []),
                    flush(run, "A", 1, a_events, record=record, reset=True),
                    flush(run, "A", 9, [], lease=None),
                ]
            )
            fenced = Applied.FENCED
            assert refused == [fenced, Applied.WRITTEN, fenced, fenced, fenced]
            # R is B's: B's state, A's first four events then B's, B's lease.
            checkpoint = await store.load(run)
            assert checkpoint is not None
            assert checkpoint.state.cause == "B" and checkpoint.state.seq == 7
            assert checkpoint.events == a_events[:4] + b_events
            assert await store.lease_holder(run) == "B"
            other_checkpoint = await store.load(other)
            assert other_checkpoint is not None and other_checkpoint.events == a_events[:1]
            # Every claim raises the epoch: once B lets R go and C takes it, B is out too.
            await store.write([flush(run, "B", 8, [], lease=None, epoch=1)])
            assert await store.claim(run, "C", 5) == 2
            [late] = await store.write([flush(run, "B", 8, [], epoch=1)])
            assert late is Applied.FENCED
            assert await store.lease_holder(run) == "C"

    asyncio.run(go())
    if store_url == redis_server.url:
        # The epoch lives beside the run's other keys, in the same Cluster hash slot.
        client = redis.Redis.from_url(redis_server.url)
        try:
            keys: list[bytes] = list(client.scan_iter(match="rg:{fence-*"))
        finally:
            client.close()
        runs = {key.split(b"}")[0] for key in keys}
        epochs = [key for key in keys if key.endswith(b":epoch")]
        assert epochs and all(epoch.split(b"}")[0] in runs for epoch in epochs)
        for tag in runs:
            assert len({key_slot(key) for key in keys if key.startswith(tag + b"}")}) == 1


class LosesOneReply:
    """A TCP relay to Redis that drops the reply to the first command carrying
    ``marker`` and closes that connection, as a network that fails right after Redis
    ran the command does: the client cannot tell whether it ran."""

    def __init__(self, target: tuple[str, int], marker: bytes) -> None:
        self.target, self.marker = target, marker
        self.dropped = 0
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        drop = asyncio.Event()

        async def upward() -> None:
            while data := await reader.read(65536):
                if self.marker in data and not self.dropped:
                    self.dropped += 1
                    drop.set()
                up_writer.write(data)
                await up_writer.drain()

        async def downward() -> None:
            while data := await up_reader.read(65536):
                if drop.is_set():
                    writer.transport.abort()  # the reply never arrives
                    return
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.create_task(upward()), asyncio.create_task(downward())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
        up_writer.close()


def test_a_claim_whose_reply_was_lost_and_retried_is_still_won(redis_server: RedisServer) -> None:
    # redis-py sends a command that failed on its connection once more (gateway.
    # checkpoint.connect.RETRY_ON). For a claim that did run, that second try used to
    # find the lease taken, by this very claim: the winner thought it had lost, and
    # its client waited a lease_ttl for nobody.
    host, port = redis_server.url.removeprefix("redis://").split("/")[0].split(":")

    async def go() -> None:
        async with opened(redis_server.url) as direct:
            run = run_id()
            record = RunRecord(run, "owner", "*", {"model": "m"}, 0.0).encode()
            await direct.write([flush(run, "A", 1, [event("a")], record=record, lease=None)])
            # The claim script is loaded, so that its first EVALSHA runs: its reply is lost.
            client = redis.Redis.from_url(redis_server.url)
            sha = client.script_load(CLAIM_SCRIPT)
            client.close()
            relay = LosesOneReply((host, int(port)), sha.encode())
            server = await relay.start()
            try:
                async with opened(f"redis://127.0.0.1:{relay.port}/0") as store:
                    assert await store.claim(run, "B#1", 5) == 1
                    assert relay.dropped == 1  # the first try's reply was lost
                    assert await direct.lease_holder(run) == "B#1"
                    assert await store.claim(run, "C#1", 5) is None  # another claim loses
            finally:
                server.close()

    asyncio.run(go())


def test_a_stale_writer_cannot_bring_back_a_run_its_new_owner_deleted(
    store_url: str | None,
) -> None:
    # completed_ttl 0: the new owner deletes the finished run. The paused owner's
    # writes must not create it again, half done, under its own lease.
    events = [event(f"w{i} ") for i in range(4)]

    async def go() -> None:
        async with opened(store_url) as store:
            run = run_id()
            record = RunRecord(run, "owner", "*", {"model": "m"}, 0.0).encode()
            await store.write([flush(run, "A", 1, events[:2], record=record)])
            await asyncio.sleep(LEASE + 0.1)
            epoch = await store.claim(run, "B", 5)
            assert epoch == 1
            await store.write([flush(run, "B", 3, events[2:], lease=None, ttl=0, epoch=epoch)])
            assert await store.load(run) is None
            [applied] = await store.write([flush(run, "A", 3, events[2:3], record=record)])
            assert applied is Applied.FENCED
            assert await store.load(run) is None
            assert await store.lease_holder(run) is None

    asyncio.run(go())


# -- the writer --------------------------------------------------------------------------


class Run:
    """A run as the writer sees it (``writer.Checkpointed``), holding its lease as A."""

    def __init__(self, run_id: str, events: list[bytes]) -> None:
        self.id = run_id
        self.last_write = 0.0
        self.events = events
        self.written = 0
        self.lost = 0

    def flush(self, owner_key: bytes, *, rewrite: bool) -> Flush:
        record = RunRecord(self.id, "owner", "*", {}, 0.0).encode()
        return flush(self.id, "A", 1, self.events, record=record, reset=True)

    def flushed(self, flush: Flush, watched: bool) -> None:
        self.written += 1
        self.last_write = asyncio.get_running_loop().time()

    def unflushed(self) -> None:
        pass

    def fenced(self) -> None:
        self.lost += 1


def test_a_fenced_writer_tells_its_run_and_never_writes_it_again(
    redis_server: RedisServer,
) -> None:
    metrics = Metrics()

    def writes(result: str) -> float:
        value = metrics.registry.get_sample_value(
            "gateway_checkpoint_writes_total", {"result": result}
        )
        return value or 0.0

    async def go() -> None:
        a_store, b_store = RedisStore(redis_server.url), RedisStore(redis_server.url)
        writer = CheckpointWriter(a_store, metrics, lease_ttl=LEASE, owner_key=b"k")
        try:
            run = Run(run_id(), [event("a ")])
            writer.mark(run)
            assert await writer.write_due() and run.written == 1
            await asyncio.sleep(LEASE + 0.1)  # A is paused: no heartbeat renews its lease
            epoch = await b_store.claim(run.id, "B", 5)
            assert epoch == 1
            await b_store.write([flush(run.id, "B", 2, [event("b ")], lease_ttl=5, epoch=epoch)])
            # A wakes up: its heartbeat is due, and refused.
            assert await writer.write_due()
            assert (run.written, run.lost) == (1, 1)
            assert writes("fenced") == 1 and writes("ok") == 1
            # Never again: no more heartbeats for it.
            for _ in range(3):
                await asyncio.sleep(LEASE / 2)
                assert await writer.write_due()
            assert writes("fenced") == 1 and writes("ok") == 1
            checkpoint = await b_store.load(run.id)
            assert checkpoint is not None and checkpoint.state.cause == "B"
        finally:
            await writer.aclose()
            await a_store.aclose()
            await b_store.aclose()

    asyncio.run(go())


# -- real replicas -----------------------------------------------------------------------


@pytest.fixture
def replicas(chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path) -> Iterator[Replicas]:
    config = replica_config(tmp_path / "gateway.yaml", chaos.base_url, redis_server.url, idle=30)
    chaos.requests.clear()
    with Replicas(config, tmp_path) as running:
        yield running


def stored(store: redis.Redis, run_id: str) -> tuple[dict[str, Any], list[Any]]:
    """A run's state and event log, as Redis holds them."""
    checkpoint = state(store, run_id)
    log: list[Any] = store.xrange(f"rg:{{{run_id}}}:events")  # type: ignore[assignment]
    return checkpoint, log


def fenced_writes(replica: Replica) -> float:
    return sum(
        s.value
        for s in replica.samples("gateway_checkpoint_writes_total")
        if s.labels["result"] == "fenced"
    )


def test_a_replica_paused_past_its_lease_loses_the_run_and_tells_its_client_to_resume(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    # A's upstream stalls after 20 deltas (the first request only): whatever A read
    # while it was frozen, it must then wait, so it cannot end the answer before it
    # learns that it lost the run. B's continuation is not stalled.
    model = "chaos:text=60,seed=41,pace_ms=20,fault=stall,at=20,times=1"
    a, b = replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 8) as (run_id, stream):
        wait_until(lambda: stored(store, run_id)[0]["seq"] >= received.chunks, "a checkpoint")
        a.freeze()  # a long pause: A neither relays nor renews its lease
        # A's client gives up on A and resumes on B, which tails the run until A's lease
        # lapses, then takes it over and finishes it.
        elsewhere = copy.deepcopy(received)
        resume_on(b, model, run_id, elsewhere)
        assert_whole_text_answer(elsewhere, model)
        assert b.resumed("takeover") == 1
        b_state, b_log = stored(store, run_id)
        assert b_state["status"] == "done"
        # A wakes up. Its first write is refused: it stops the run and its client is
        # told, in band, to resume it.
        a.process.send_signal(signal.SIGCONT)
        with stream, pytest.raises(openai.APIError) as moved:
            receive(stream, received)
    assert moved.value.code == "run_moved"
    assert f"x-run-id: {run_id}" in moved.value.message
    assert received.finish_reasons == []  # A did not finish the answer on its own
    wait_until(lambda: fenced_writes(a) >= 1, "A's write refused")
    # The run is still B's: A wrote nothing over it, nor took the lease back.
    assert stored(store, run_id) == (b_state, b_log)
    assert not store.exists(f"rg:{{{run_id}}}:lease")
    # And the client, resuming as it was told, gets the rest of B's answer.
    resume_on(b, model, run_id, received)
    assert_whole_text_answer(received, model)

"""Resuming across replicas: real gateway processes (the CLI) sharing one real Redis.

A client starts a stream on replica A and comes back on another replica, either
while A still relays the run (a live tail through the Redis Stream) or after A
was killed with SIGKILL (a takeover from the checkpoint, continuing the
upstream). Whatever the timing, the client's assembled answer must be the
uninterrupted one, and exactly one replica may continue the upstream.

To kill A at a chosen point relative to its checkpoints, A is first frozen
(SIGSTOP: it neither sends nor checkpoints any more), the checkpoint is read
from Redis, then A is killed (SIGKILL).
"""

from __future__ import annotations

import copy
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import orjson
import pytest
import redis
from openai import Stream
from openai.types.chat import ChatCompletionChunk

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import MESSAGES, Received, assert_whole_text_answer, resume
from tests.durable.two_replicas import (
    continued_prefix,
    drain,
    lease_held,
    posted,
    read_rest,
    resume_on,
    sdk,
    started,
    state,
)
from tests.processes import DEADLINE, Replica, Replicas, replica_config, wait_until
from tests.redis_server import frozen, local_redis

# -- live tail ------------------------------------------------------------------------


def test_sdk_resume_on_another_replica_tails_the_live_run(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=100,seed=11,pace_ms=20"
    a, b = replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 12) as (run_id, stream):
        stream.close()  # the client goes away; A relays on
    assert state(store, run_id)["status"] == "running"
    assert lease_held(store, run_id)
    resume_on(b, model, run_id, received)
    assert_whole_text_answer(received, model)
    # B followed A through Redis: it neither took the run over nor asked the upstream.
    # (A tail that meets the run finished between two reads ends by replaying it, which
    # gateway_resumes_total counts once more, as a replay: it may or may not show here.)
    resumes = b.resumes()
    assert resumes[("tail", "ok")] == 1.0 and ("takeover", "ok") not in resumes
    assert set(resumes) <= {("tail", "ok"), ("replay", "ok")}
    assert a.process.poll() is None
    assert len(chaos.requests_for(model)) == 1
    wait_until(lambda: state(store, run_id)["status"] == "done", "A completes the run")


def test_event_source_resume_on_another_replica_tails_with_consecutive_ids(
    replicas: Replicas, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=80,seed=12,pace_ms=20"
    a, b = replicas.start("A", "B")
    before: list[bytes] = []
    with posted(a, model) as first:
        run_id = first.headers["x-run-id"]
        buffer = b""
        for data in first.iter_raw():
            buffer += data
            *complete, buffer = buffer.split(b"\n\n")
            before += complete
            if len(before) >= 9:
                break
    rest = read_rest(b, run_id, len(before))
    payloads = [e.removeprefix(b"data: ") for e in before] + rest[:-1]
    chunks = [orjson.loads(p) for p in payloads]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == expected_answer(model).text
    assert b.resumes() == {("tail", "ok"): 1.0}
    assert len(chaos.requests_for(model)) == 1


# -- crash resume ---------------------------------------------------------------------


def kill_behind(a: Replica, store: redis.Redis, run_id: str, received: Received) -> int:
    """Kill A once its checkpoint is well past what the client has; the checkpoint's seq."""
    wait_until(lambda: state(store, run_id)["seq"] >= received.chunks + 8, "A checkpoints ahead")
    a.freeze()
    seq: int = state(store, run_id)["seq"]
    a.kill()
    return seq


def kill_ahead(
    a: Replica,
    store: redis.Redis,
    run_id: str,
    stream: Stream[ChatCompletionChunk],
    received: Received,
) -> int:
    """Kill A while the client has events A did not checkpoint yet; the checkpoint's seq."""
    deadline = time.monotonic() + DEADLINE
    for chunk in stream:
        received.feed(chunk)
        if state(store, run_id)["seq"] < received.chunks:
            a.freeze()
            seq: int = state(store, run_id)["seq"]
            if seq < received.chunks:
                a.kill()
                return seq
            a.process.send_signal(signal.SIGCONT)
        assert time.monotonic() < deadline
    raise AssertionError("the client was never ahead of A's checkpoint")


def test_with_sync_durability_no_client_is_ever_ahead_of_the_store(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=60,seed=69,pace_ms=10"
    a, b = replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 1) as (run_id, stream):
        for chunk in stream:
            received.feed(chunk)
            # Read after the chunk arrived: the checkpoint holding it was acknowledged first.
            assert state(store, run_id)["seq"] >= received.chunks
            if received.chunks == 30:
                a.freeze()
                a.kill()
                break
        drain(stream, received)
    resume_on(b, model, run_id, received)
    assert_whole_text_answer(received, model)
    assert b.resumed("takeover") == 1


def test_sdk_resume_after_the_owner_is_killed_takes_the_run_over(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=80,seed=68,pace_ms=25"
    a, b = replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 8) as (run_id, stream):
        seq = kill_behind(a, store, run_id, received)
        stream.close()
        assert received.chunks < seq
    assert received.finish_reasons == [], "A finished before it was killed"
    resume_on(b, model, run_id, received)
    assert_whole_text_answer(received, model)
    assert b.resumed("takeover") == 1
    # One continuation, from exactly the text A had checkpointed.
    original, continuation = chaos.requests_for(model)
    prefix = continued_prefix(continuation)
    assert prefix and expected_answer(model).text.startswith(prefix)
    assert state(store, run_id)["status"] == "done"
    assert not lease_held(store, run_id)


def test_a_requests_own_fallbacks_survive_a_takeover(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    # The primary answers 500 to every request: A moves to the request's own fallback
    # (its ``fallbacks`` field), and dies there. B must go on with that leg, as A had it.
    primary = "chaos:text=20,seed=70,fault=http_500"
    fallback = "chaos:text=80,seed=71,pace_ms=25"
    a, b = replicas.start("A", "B")
    received = Received()
    with sdk(a) as client_a:
        raw = client_a.chat.completions.with_raw_response.create(
            model=primary, messages=MESSAGES, stream=True, extra_body={"fallbacks": [fallback]}
        )
        run_id, stream = raw.headers["x-run-id"], raw.parse()
        for chunk in stream:
            received.feed(chunk)
            if received.chunks == 8:
                break
        kill_behind(a, store, run_id, received)
        stream.close()
    assert state(store, run_id)["leg"] == 1  # on the fallback when A died
    resume_on(b, primary, run_id, received)
    assert_whole_text_answer(received, fallback)
    assert b.resumed("takeover") == 1
    first, continuation = chaos.requests_for(fallback)
    assert continued_prefix(continuation)  # B continued the fallback's answer


def test_redis_down_then_the_replica_dead_ends_in_the_explicit_error(
    chaos: ChaosUpstream, tmp_path: Path
) -> None:
    # Redis stops answering (frozen); after unprotected_after, A's events go out
    # unprotected, so its client gets ahead of the store; then A dies and Redis comes
    # back. No count of B's new events is that client's text: it gets the error.
    model = "chaos:text=120,seed=72,pace_ms=25,sample=1"
    settings = {"unprotected_after": 0.3, "wait_timeout": 0.3}
    with local_redis() as server:
        config = replica_config(
            tmp_path / "gateway.yaml", chaos.base_url, server.url, state=settings
        )
        with Replicas(config, tmp_path) as replicas:
            a, b = replicas.start("A", "B")
            received = Received()
            with started(a, model, received, 6) as (run_id, stream):
                with frozen(server):
                    held = received.chunks
                    for chunk in stream:  # events come again once they go out unprotected
                        received.feed(chunk)
                        if received.chunks >= held + 10:
                            break
                    a.freeze()
                    a.kill()
                    drain(stream, received)
            with pytest.raises(openai.APIError) as raised:
                resume_on(b, model, run_id, received)
            assert raised.value.code == "resume_not_exact"
            assert b.resumes()[("takeover", "not_exact")] == 1
            assert len(chaos.requests_for(model)) == 1  # nothing continued upstream


def test_a_client_ahead_of_the_checkpoint_is_told_its_answer_cannot_be_resumed_exactly(
    async_replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    # durability: async: A releases events before their checkpoint. The client holds
    # more than the store when A dies: no count of B's new events is its text (B's leg
    # chunks and words it otherwise), so it gets the explicit error, and B continues
    # nothing upstream.
    model = "chaos:text=80,seed=68,pace_ms=25,sample=1"
    a, b = async_replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 8) as (run_id, stream):
        seq = kill_ahead(a, store, run_id, stream, received)
        drain(stream, received)  # events A wrote to the socket before it died
    assert received.chunks > seq  # the crash window: the client is ahead
    # A's lease has not expired yet: B tails the run (the stream starts) until it has,
    # then ends it with the error in band, which the SDK raises.
    with pytest.raises(openai.APIError) as raised:
        resume_on(b, model, run_id, received)
    assert raised.value.code == "resume_not_exact"
    assert "cannot be resumed exactly" in raised.value.message
    assert b.resumes()[("takeover", "not_exact")] == 1
    assert len(chaos.requests_for(model)) == 1  # nothing continued upstream
    assert not lease_held(store, run_id)  # refused before any claim


def test_takeover_of_a_checkpoint_with_completed_tool_calls_finishes_without_the_upstream(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=10,tools=3,arg_deltas=12,seed=3,pace_ms=40"
    answer = expected_answer(model)
    a, b = replicas.start("A", "B")
    received = Received()
    with started(a, model, received, 1) as (run_id, stream):
        for chunk in stream:
            received.feed(chunk)
            if received.tool_calls:
                break
        wait_until(lambda: state(store, run_id)["tool_calls"] >= 1, "a checkpoint with a call")
        a.freeze()
        checkpoint = state(store, run_id)
        a.kill()
        stream.close()
    assert checkpoint["status"] == "running"
    assert checkpoint["seq"] >= received.chunks
    completed = checkpoint["tool_calls"]
    assert 1 <= completed < len(answer.tool_calls)
    resume_on(b, model, run_id, received)
    assert received.text == answer.text
    assert received.finish_reasons == ["tool_calls"]
    expected_calls = [(c.id, c.name, c.arguments) for c in answer.tool_calls[:completed]]
    assert received.calls() == expected_calls  # the completed calls, and only those
    assert b.resumed("takeover") == 1
    assert len(chaos.requests_for(model)) == 1  # no continuation was requested
    assert state(store, run_id)["status"] == "done"


# -- exactly one takeover ---------------------------------------------------------------


@pytest.mark.parametrize("lease", ["held", "expired"])
def test_concurrent_resumes_after_the_owner_died_continue_the_upstream_once(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis, lease: str
) -> None:
    model = "chaos:text=80,seed=114,pace_ms=25"  # no held seam early on, as seed 68 above
    a, b, c = replicas.start("A", "B", "C")
    received = Received()
    with started(a, model, received, 10) as (run_id, stream):
        a.kill()
        stream.close()
    if lease == "held":
        # The resumers find the dead owner's lease and tail until it expires; then
        # every one of them tries to claim it.
        assert lease_held(store, run_id)
    else:
        wait_until(lambda: not lease_held(store, run_id), "A's lease expires")
    resumers = [b, c] * 3
    barrier = threading.Barrier(len(resumers))

    def resume_on(replica: Replica) -> Received:
        mine = copy.deepcopy(received)
        with sdk(replica) as client:
            barrier.wait(DEADLINE)
            return resume(client, model, run_id, mine)

    with ThreadPoolExecutor(len(resumers)) as pool:
        results = list(pool.map(resume_on, resumers))
    for result in results:
        assert_whole_text_answer(result, model)
    counts = [b.resumes(), c.resumes()]
    assert sum(count.get(("takeover", "ok"), 0.0) for count in counts) == 1
    original, continuation = chaos.requests_for(model)  # exactly one continuation
    assert expected_answer(model).text.startswith(continued_prefix(continuation))
    assert state(store, run_id)["status"] == "done"

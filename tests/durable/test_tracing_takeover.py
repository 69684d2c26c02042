"""Traces through a takeover: replica A is killed mid-run, B takes the run over.

Two gateway processes on one Redis, tracing on the standard way (only
``OTEL_EXPORTER_OTLP_ENDPOINT`` in their environment), exporting to an OTLP/HTTP
receiver on loopback. A killed process never exports its open spans: A's run span is
lost with it. What the trace keeps is its context, stored in the run's checkpoint: B's
run span links to it, and is a child of the resuming client's span when the client
sends one, in the same trace as the first request.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
import redis

from gateway.chaos import ChaosUpstream
from tests.api.streams import Received, assert_whole_text_answer, resume, start
from tests.api.test_tracing import Traceparent, parse
from tests.durable.test_replicas import kill_behind
from tests.durable.two_replicas import sdk
from tests.otlp import Receiver, running_receiver
from tests.processes import Replicas


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def record(store: redis.Redis, run_id: str) -> dict[str, object]:
    raw = store.get(f"rg:{{{run_id}}}:record")
    assert raw is not None
    stored: dict[str, object] = orjson.loads(raw)
    return stored


@pytest.mark.parametrize("resumed_in_trace", [True, False], ids=["client-context", "linked"])
def test_a_takeover_is_a_run_span_linked_to_the_lost_one(
    replicas: Replicas,
    chaos: ChaosUpstream,
    store: redis.Redis,
    receiver: Receiver,
    resumed_in_trace: bool,
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    a, b = replicas.start("A", "B", env=env)
    model = f"chaos:text=80,seed={110 + resumed_in_trace},pace_ms=25"
    first_call, resume_call = Traceparent(), Traceparent()
    resume_call.trace_id = first_call.trace_id  # the same trace, another client span
    received = Received()
    with sdk(a) as client_a:
        client_a = client_a.with_options(default_headers={"traceparent": first_call.header})
        run_id, stream = start(client_a, model, received, 8)
        kill_behind(a, store, run_id, received)
        stream.close()
    # A's span was never exported; its context is in the checkpoint.
    lost_trace, lost_span = parse(str(record(store, run_id)["trace"]))
    assert lost_trace == first_call.trace_id
    with sdk(b) as client_b:
        if resumed_in_trace:
            client_b = client_b.with_options(default_headers={"traceparent": resume_call.header})
        resume(client_b, model, run_id, received)
    assert_whole_text_answer(received, model)
    assert b.resumed("takeover") == 1

    spans = receiver.of_run(run_id)
    [run] = [s for s in spans if s.kind == "server" and s.name != "resume"]
    [resumed] = receiver.resumes(run_id)
    assert run.attributes["gateway.takeover"] is True
    assert run.attributes["gateway.outcome"] == "done"
    assert (lost_trace, lost_span) in run.links
    # B found A's lease held (it tails until the lease expires, then takes over) or free.
    assert resumed.attributes["gateway.resume.kind"] in ("tail", "takeover")
    assert (lost_trace, lost_span) in resumed.links
    assert (run.trace_id, run.parent_id) == (resumed.trace_id, resumed.span_id)
    if resumed_in_trace:
        assert (resumed.trace_id, resumed.parent_id) == (first_call.trace_id, resume_call.span_id)
    else:
        assert resumed.trace_id != first_call.trace_id and resumed.parent_id == ""
    [(_, recovery)] = [e for e in run.events if e[0] == "gateway.recovery"]
    assert recovery["gateway.interruption.cause"] == "replica_lost"
    [leg] = [s for s in spans if s.parent_id == run.span_id]
    assert leg.attributes["gateway.continuation"] == "continue_text"

    first_request, continuation = chaos.requests_for(model)
    assert parse(first_request.headers["traceparent"])[0] == first_call.trace_id
    assert parse(continuation.headers["traceparent"]) == (run.trace_id, leg.span_id)


def test_a_tail_on_another_replica_is_a_resume_span_linked_to_the_live_run(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis, receiver: Receiver
) -> None:
    # A relays on; the client resumes on B, which follows A through Redis. B's resume
    # span is in the resuming client's trace and links A's run span (A exports it).
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    a, b = replicas.start("A", "B", env=env)
    model = "chaos:text=80,seed=115,pace_ms=20"
    first_call, resume_call = Traceparent(), Traceparent()
    received = Received()
    with sdk(a) as client_a:
        client_a = client_a.with_options(default_headers={"traceparent": first_call.header})
        run_id, stream = start(client_a, model, received, 8)
        stream.close()  # the client goes away; A relays on
    with sdk(b) as client_b:
        client_b = client_b.with_options(default_headers={"traceparent": resume_call.header})
        resume(client_b, model, run_id, received)
    assert_whole_text_answer(received, model)
    assert b.resumed("tail") == 1

    [run] = [s for s in receiver.trace(first_call.trace_id) if s.kind == "server"]
    [resume_span] = receiver.resumes(run_id)
    assert (resume_span.trace_id, resume_span.parent_id) == (
        resume_call.trace_id,
        resume_call.span_id,
    )
    assert resume_span.attributes["gateway.resume.kind"] == "tail"
    assert resume_span.attributes["gateway.resume.after"] == 8
    assert resume_span.links == [(run.trace_id, run.span_id)]
    # B started no run span of its own (one would have ended before its resume span).
    runs = [s for s in receiver.spans if s.attributes.get("gateway.run.id") == run_id]
    assert [s.span_id for s in runs if s.name != "resume"] == [run.span_id]

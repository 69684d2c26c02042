"""A crash resume is exact even when every upstream request chunks, or says, it otherwise.

Real models do: a continuation is a new request with its own token boundaries
(the chaos upstream's ``rechunk=1``), and a sampling model continues with other
words than the first request would have (``sample=1``). Two real gateway
processes share one real Redis with the default durability (sync): an event
reaches the client only once the checkpoint holding it is acknowledged, so the
client is never ahead of the store. Replica A is SIGKILLed after the client read
``k`` events; the client resumes on B, which continues the upstream from the
checkpoint.

What the client assembles must then be, byte for byte, the answer (``rechunk``),
or what it had plus the rest of the checkpoint plus exactly what the upstream
answered the continuation (``sample``): nothing it held lost or repeated, a clean
seam, one finish.
"""

from __future__ import annotations

import contextlib
from typing import Any

import httpx2
import openai
import orjson
import pytest
import redis

from gateway.chaos import ChaosUpstream, RecordedRequest, expected_answer, sampled_answer
from gateway.chaos.answer import attempt_deltas
from gateway.chaos.spec import parse_spec
from tests.api.streams import MESSAGES, Received
from tests.durable.two_replicas import (
    check_retrieved,
    continued_prefix,
    drain,
    kill,
    posted,
    read_rest,
    resume_on,
    sdk,
    start_response,
    state,
)
from tests.processes import Replicas

MODES = ["rechunk", "sample"]
# k: right after the first content event (the role comes first), a few deltas in,
# deep into the answer (negative: that many events before the finish; an attempt's
# number of deltas varies, so it is counted from what the upstream plans to say).
DEPTHS = [2, 9, -12]


# -- helpers --------------------------------------------------------------------------------


def model_for(mode: str, seed: int) -> str:
    return f"chaos:text=60,seed={seed},pace_ms=20,{mode}=1"


def events_planned(chaos: ChaosUpstream, model: str) -> int:
    """The chunks the first request of ``model`` streams: role, text deltas, finish."""
    (request,) = chaos.requests_for(model)
    assert request.attempt is not None
    deltas = attempt_deltas(parse_spec(model), request.attempt, "")
    assert deltas is not None
    return len(deltas) + 2


def legs(chaos: ChaosUpstream, model: str) -> tuple[RecordedRequest, RecordedRequest]:
    """The original request and its one continuation (and no other request)."""
    requests = chaos.requests_for(model)
    assert len(requests) == 2, [(r.prefix, r.attempt) for r in requests]
    original, continuation = requests
    assert original.prefix == "" and continuation.prefix
    # What the chaos upstream recognised is what the gateway sent.
    assert continuation.prefix == continued_prefix(continuation)
    return original, continuation


def check_leg_variance(
    mode: str, model: str, original: RecordedRequest, cont: RecordedRequest
) -> None:
    """The continuation really did differ from the first request, past the prefix."""
    prefix = cont.prefix
    assert prefix is not None
    assert original.answered_text is not None and cont.answered_text is not None
    assert cont.attempt is not None and original.attempt is not None
    if mode == "sample":
        assert original.answered_text.startswith(prefix)  # the checkpoint is the first leg's
        assert cont.answered_text == sampled_answer(model, cont.attempt, prefix)
        assert cont.answered_text != original.answered_text[len(prefix) :]
        return
    spec = parse_spec(model)
    first = attempt_deltas(spec, original.attempt, "")
    then = attempt_deltas(spec, cont.attempt, prefix)
    assert first is not None and then is not None
    if len(then) > 2:  # a tail of two deltas can fall alike by chance
        assert first[-len(then) :] != then


def check_exact(mode: str, model: str, text: str, held: str, cont: RecordedRequest) -> None:
    """``text``, assembled by the client, is exact; ``held`` is what it had at the kill."""
    prefix = cont.prefix
    assert prefix is not None and cont.answered_text is not None
    # The continuation continues from the checkpoint, which holds all the client had.
    assert prefix.startswith(held)
    if mode == "rechunk":
        assert text == expected_answer(model).text
    else:
        # What the client held, the rest of the checkpoint, then the new leg's own words;
        # the anchor the continuation repeated first (``echo``) trimmed exactly.
        assert text == prefix + cont.answered_text
        assert text.startswith(held)


# -- chat completions through the openai SDK ---------------------------------------------------


@pytest.mark.parametrize("k", DEPTHS)
@pytest.mark.parametrize("mode", MODES)
def test_sdk_resume_after_a_crash_is_exact(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis, mode: str, k: int
) -> None:
    model = model_for(mode, 200 + k)
    a, b = replicas.start("A", "B")
    received = Received()
    with sdk(a) as client_a:
        raw = client_a.chat.completions.with_raw_response.create(
            model=model, messages=MESSAGES, stream=True
        )
        run_id = raw.headers["x-run-id"]
        stream = raw.parse()
        if k < 0:
            k += events_planned(chaos, model)
        for chunk in stream:
            received.feed(chunk)
            # The zero window: the checkpoint holding this event was acknowledged first.
            assert state(store, run_id)["seq"] >= received.chunks
            if received.chunks == k:
                break
        held = received.text
        seq = kill(a, store, run_id)
        drain(stream, received)
    assert received.chunks <= seq, "the client got ahead of the checkpoint"
    assert received.finish_reasons == [], "A finished before it was killed"
    assert held and received.text.startswith(held)
    had = received.text  # with what the dead replica's socket still held
    resume_on(b, model, run_id, received)
    assert b.resumed("takeover") == 1
    original, continuation = legs(chaos, model)
    check_leg_variance(mode, model, original, continuation)
    check_exact(mode, model, received.text, held, continuation)
    assert continuation.prefix is not None and continuation.prefix.startswith(had)
    assert received.roles == ["assistant"]
    assert received.finish_reasons == ["stop"]
    assert len(received.ids) == 1


def test_a_takeover_asks_for_what_is_left_of_the_clients_budget(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    """The checkpoint carries the output tokens A's leg produced: B's continuation asks
    for the client's max_tokens less those, never the whole budget again."""
    model = model_for("rechunk", 250)
    budget = 500
    a, b = replicas.start("A", "B")
    received = Received()
    with sdk(a) as client_a:
        raw = client_a.chat.completions.with_raw_response.create(
            model=model, messages=MESSAGES, stream=True, max_tokens=budget
        )
        run_id = raw.headers["x-run-id"]
        stream = raw.parse()
        for chunk in stream:
            received.feed(chunk)
            if received.chunks == 9:
                break
        kill(a, store, run_id)
        spent = state(store, run_id)["output_spent"]
        drain(stream, received)
    resume_on(b, model, run_id, received)
    assert b.resumed("takeover") == 1
    _, continuation = legs(chaos, model)
    assert spent >= 8  # a token a delta: every text delta the client had, at least
    assert continuation.body["max_tokens"] == budget - spent
    assert received.text == expected_answer(model).text
    assert received.finish_reasons == ["stop"]


# -- EventSource: GET /v1/runs/{id}/events with Last-Event-ID --------------------------------


def sse_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The data of each complete event in ``buffer`` (comments skipped), and the rest."""
    *blocks, rest = buffer.split(b"\n\n")
    events = []
    for block in blocks:
        data = [line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")]
        if data:
            events.append(b"\n".join(data))
    return events, rest


def chat_text(payloads: list[bytes]) -> tuple[str, list[str]]:
    """The text and the finish reasons of chat chunk payloads ([DONE] skipped)."""
    text, finishes = "", []
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        chunk = orjson.loads(payload)
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    return text, finishes


@pytest.mark.parametrize("mode", MODES)
def test_event_source_resume_after_a_crash_is_exact(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis, mode: str
) -> None:
    model = model_for(mode, 300)
    a, b = replicas.start("A", "B")
    before: list[bytes] = []
    with posted(a, model) as first:
        run_id = first.headers["x-run-id"]
        buffer = b""
        pieces = first.iter_raw()
        for data in pieces:
            complete, buffer = sse_events(buffer + data)
            before += complete
            assert state(store, run_id)["seq"] >= len(before)
            if len(before) >= 20:
                break
        held, _ = chat_text(before)
        seq = kill(a, store, run_id)
        with contextlib.suppress(httpx2.HTTPError):
            for data in pieces:
                complete, buffer = sse_events(buffer + data)
                before += complete
    assert len(before) <= seq, "the client got ahead of the checkpoint"
    text, finishes = chat_text(before + read_rest(b, run_id, len(before)))
    assert finishes == ["stop"]
    assert b.resumed("takeover") == 1
    original, continuation = legs(chaos, model)
    check_leg_variance(mode, model, original, continuation)
    check_exact(mode, model, text, held, continuation)


# -- the Responses API -------------------------------------------------------------------------


def test_responses_retrieve_after_a_crash_is_exact_with_rechunked_legs(
    replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = model_for("rechunk", 400)
    a, b = replicas.start("A", "B")
    first: list[Any] = []
    with sdk(a) as client:
        run_id, stream = start_response(client, model)
        for event in stream:
            first.append(event)
            assert state(store, run_id)["seq"] >= len(first)
            if len(first) == 14:
                break
        held = "".join(e.delta for e in first if e.type == "response.output_text.delta")
        seq = kill(a, store, run_id)
        with contextlib.suppress(httpx2.HTTPError, openai.APIError), stream:
            for event in stream:
                first.append(event)
    assert len(first) <= seq, "the client got ahead of the checkpoint"
    assert held
    check_retrieved(b, first, model)
    assert b.resumed("takeover") == 1
    original, continuation = legs(chaos, model)
    check_leg_variance("rechunk", model, original, continuation)
    assert continuation.prefix is not None and continuation.prefix.startswith(held)

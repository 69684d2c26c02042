"""Anthropic Messages runs across replicas: real gateway processes sharing one real Redis.

The replicas route ``/v1/messages`` to an upstream of ``kind: anthropic`` (the chaos
server's ``/v1/messages``, its ``base_url`` without ``/v1`` as the anthropic SDK takes
it), listed after the openai-kind one the other tests of this folder use: a route's
first upstream that serves the Messages API answers, on the replica that starts a run
and on the one that takes it over.

A client, the official anthropic SDK where it can be, starts a stream on replica A
and comes back on B after A was SIGKILLed (frozen first, so it neither sends nor
checkpoints any more): B takes the run over from the checkpoint and continues the
upstream. What the client read before and after must be one Messages stream.

The anthropic SDK presents its ``api_key`` as ``Authorization: Bearer``, which owns the
runs it starts; a client that sends ``x-api-key`` alone owns its runs by that key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import orjson
import pytest
import redis
from anthropic.types import MessageParam, RawMessageStreamEvent

from gateway.chaos import ChaosUpstream, expected_answer, thinking_signature
from tests.durable.two_replicas import AUTH, CREDENTIAL, state
from tests.processes import DEADLINE, Replica, Replicas, add_upstream, replica_config, wait_until
from tests.redis_server import RedisServer

MESSAGES: list[MessageParam] = [{"role": "user", "content": "Tell me a story."}]
MAX_TOKENS = 1024
API_KEY = "sk-ant-owner"  # a client that sends x-api-key, not Authorization
VERSION = {"anthropic-version": "2026-10-21"}  # not the gateway's default
BETA = {"beta": "true"}


@pytest.fixture
def anthropic_replicas(
    chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Replicas]:
    """The ``replicas`` of ``conftest.py`` (default durability, sync), plus an upstream
    of ``kind: anthropic`` on the chaos server and a catch-all route to it after the
    openai-kind one."""
    path = replica_config(tmp_path / "gateway.yaml", chaos.base_url, redis_server.url)
    add_upstream(path, "claude", "anthropic", chaos.base_url.removesuffix("/v1"))
    chaos.requests.clear()
    with Replicas(path, tmp_path) as running:
        yield running


@contextlib.contextmanager
def sdk(replica: Replica, api_key: str = CREDENTIAL) -> Iterator[anthropic.Anthropic]:
    """The anthropic SDK on ``replica``: its base URL stops before ``/v1``."""
    with anthropic.Anthropic(
        base_url=replica.url, api_key=api_key, max_retries=0, timeout=DEADLINE
    ) as client:
        yield client


# -- reading a Messages stream ----------------------------------------------------------------


@dataclass
class SSE:
    """One server-sent event: its ``id:`` (None without one), ``event:`` and data."""

    id: int | None
    event: str | None
    data: bytes


def sse(lines: Iterable[str]) -> Iterator[SSE]:
    """The events of an SSE body's lines (comments skipped)."""
    number: int | None = None
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SSE(number, name, "\n".join(data).encode())
            number, name, data = None, None, []
        elif line.startswith("id: "):
            number = int(line[4:])
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
    assert not data, "the body ended inside an event"


def payloads(events: Iterable[SSE]) -> list[dict[str, Any]]:
    """The data of Messages events, each named by its ``event:`` line as its type."""
    documents = []
    for event in events:
        document: dict[str, Any] = orjson.loads(event.data)
        assert event.event == document["type"], event
        documents.append(document)
    return documents


def replayed(replica: Replica, run_id: str, headers: dict[str, str], after: int) -> list[SSE]:
    """``GET /v1/runs/{id}/events`` with ``Last-Event-ID: after``; every event has an id."""
    url = f"{replica.base_url}/runs/{run_id}/events"
    with (
        httpx2.Client(timeout=DEADLINE) as http,
        http.stream("GET", url, headers=headers | {"last-event-id": str(after)}) as response,
    ):
        assert response.status_code == 200
        events = list(sse(response.iter_lines()))
    assert all(event.id is not None for event in events), "an event without an id"
    return events


@dataclass
class Assembled:
    """A Messages stream, checked to read as one, and the Message it assembles to."""

    message: dict[str, Any]  # as message_start said it
    content: list[dict[str, Any]]
    stop_reason: str | None


def assemble(events: list[dict[str, Any]]) -> Assembled:
    """Check that ``events`` (what a client read, in order) are one Messages stream:
    one message_start first; content blocks 0, 1, 2… each started, then its deltas,
    then stopped, one at a time; one message_delta; message_stop last. Assemble them."""
    kinds = [event["type"] for event in events]
    assert kinds[0] == "message_start" and kinds.count("message_start") == 1, kinds
    assert kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert kinds.count("message_delta") == 1 and kinds.count("message_stop") == 1, kinds
    content: list[dict[str, Any]] = []
    json: list[list[str]] = []
    signatures: list[int] = []
    open_block: int | None = None
    for event in events[1:-2]:
        kind, index = event["type"], event.get("index")
        if kind == "content_block_start":
            assert open_block is None, f"block {index} starts inside block {open_block}"
            assert index == len(content), f"block {index} after {len(content)} blocks"
            content.append(dict(event["content_block"]))
            json.append([])
            signatures.append(0)
            open_block = index
        elif kind == "content_block_delta":
            assert open_block is not None and index == open_block, (index, open_block)
            block, delta = content[index], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
                signatures[index] += 1
            elif delta["type"] == "input_json_delta":
                json[index].append(delta["partial_json"])
            else:
                raise AssertionError(f"an unexpected delta: {event}")
        elif kind == "content_block_stop":
            assert open_block is not None and index == open_block, (index, open_block)
            open_block = None
        else:
            raise AssertionError(f"an unexpected event inside the message: {event}")
    assert open_block is None
    for block, parts, signed in zip(content, json, signatures, strict=True):
        if block["type"] == "tool_use":
            block["input"] = orjson.loads("".join(parts)) if parts else block["input"]
        assert signed == (block["type"] == "thinking"), f"{signed} signatures: {block}"
    message_delta = events[-2]
    return Assembled(
        message=events[0]["message"],
        content=content,
        stop_reason=message_delta["delta"]["stop_reason"],
    )


def text_of(events: list[dict[str, Any]]) -> str:
    """The text a client has read so far."""
    return "".join(
        event["delta"]["text"]
        for event in events
        if event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta"
    )


def check_whole_answer(events: list[dict[str, Any]], model: str) -> Assembled:
    """``events`` are one stream saying the uninterrupted answer of ``model``: one signed
    thinking block (the first response's), one text block, whole tool_use blocks."""
    answer = expected_answer(model)
    assembled = assemble(events)
    kinds = [block["type"] for block in assembled.content]
    assert kinds == ["thinking", "text"] + ["tool_use"] * len(answer.tool_calls), kinds
    thinking, said, *calls = assembled.content
    assert thinking["thinking"] == answer.reasoning
    number = int(assembled.message["id"].removeprefix("msg_chaos_"))
    assert thinking["signature"] == thinking_signature(number, answer.reasoning)
    assert said["text"] == answer.text
    assert [(call["id"], call["name"], call["input"]) for call in calls] == [
        (call.id, call.name, orjson.loads(call.arguments)) for call in answer.tool_calls
    ]
    assert assembled.stop_reason == "tool_use"
    assert assembled.message["model"] == model
    return assembled


def kill_when_checkpointed_ahead(
    a: Replica, store: redis.Redis, run_id: str, received: int
) -> None:
    """Once A's checkpoint is well past the ``received`` events a client read, SIGKILL A."""
    wait_until(lambda: state(store, run_id)["seq"] >= received + 6, "A checkpoints ahead")
    a.freeze()
    a.kill()


def start_stream(
    client: anthropic.Anthropic, model: str
) -> tuple[str, anthropic.Stream[RawMessageStreamEvent]]:
    """A Messages stream of ``model`` started as Claude Code calls it (``?beta=true``):
    its run id, and the stream, not read yet."""
    raw = client.messages.with_raw_response.create(
        model=model, max_tokens=MAX_TOKENS, messages=MESSAGES, stream=True, extra_query=BETA
    )
    return raw.headers["x-run-id"], raw.parse()


def read_then_kill(
    a: Replica, store: redis.Redis, model: str, count: int
) -> tuple[str, list[dict[str, Any]]]:
    """Stream ``model`` from ``a`` with the SDK, read ``count`` events, then SIGKILL ``a``
    once its checkpoint is ahead of the client: (run id, the events the client has)."""
    first: list[dict[str, Any]] = []
    with sdk(a) as client:
        run_id, stream = start_stream(client, model)
        for event in stream:
            first.append(event.to_dict(mode="json"))
            if len(first) == count:
                break
        kill_when_checkpointed_ahead(a, store, run_id, len(first))
        stream.close()
    return run_id, first


def resume_with_sdk(
    replica: Replica, model: str, resume: dict[str, str], api_key: str = CREDENTIAL
) -> list[dict[str, Any]]:
    """The rest of a run, as the anthropic SDK reads it from ``replica`` (``resume``: the
    x-run-id and x-resume-from headers) with ``api_key``."""
    with (
        sdk(replica, api_key) as client,
        client.messages.create(
            model=model,
            max_tokens=MAX_TOKENS,
            messages=MESSAGES,
            stream=True,
            extra_headers=resume,
        ) as rest,
    ):
        return [event.to_dict(mode="json") for event in rest]


# -- takeover through the anthropic SDK ---------------------------------------------------------


def test_sdk_resume_on_another_replica_after_the_owner_is_killed_takes_the_run_over(
    anthropic_replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=80,seed=41,pace_ms=25,reasoning=4,tools=1"
    a, b = anthropic_replicas.start("A", "B")
    run_id, first = read_then_kill(a, store, model, 10)
    held = text_of(first)
    assert held, "the client has no text yet: the kill is not mid-text"
    resume = {"x-run-id": run_id, "x-resume-from": str(len(first))}
    events = first + resume_with_sdk(b, model, resume)
    check_whole_answer(events, model)
    assert b.resumed("takeover") == 1
    # B continued the upstream through the anthropic-kind upstream, from the checkpoint,
    # which holds all the client had (a prefill, its trailing whitespace cut).
    original, continuation = chaos.requests_for(model)
    assert original.path == continuation.path == "/v1/messages"
    # The query the client started the run with, kept in the run's record.
    assert original.query == continuation.query == "beta=true"
    assert original.prefix == ""
    # The SDK's own headers went with the takeover too (the resuming client's).
    for name in ("anthropic-version", "authorization", "user-agent"):
        assert continuation.headers[name] == original.headers[name]
    prefix = continuation.prefix
    assert prefix and prefix.startswith(held.rstrip())
    assert expected_answer(model).text.startswith(prefix)
    assert continuation.body["messages"][-1] == {"role": "assistant", "content": prefix}
    # What B replays of the run is what the client read across both replicas.
    assert payloads(replayed(b, run_id, AUTH, 0)) == events


# -- GET /v1/runs/{id}/events ------------------------------------------------------------------


def test_events_of_a_finished_run_replay_on_another_replica(
    anthropic_replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=30,seed=43,reasoning=3,tools=2"
    a, b = anthropic_replicas.start("A", "B")
    with sdk(a) as client:
        run_id, stream = start_stream(client, model)
        with stream:
            got = [event.to_dict(mode="json") for event in stream]
    check_whole_answer(got, model)
    wait_until(lambda: state(store, run_id)["status"] == "done", "A records the run done")
    a.terminate()  # B reads the run from Redis alone
    a.process.wait(10)
    events = replayed(b, run_id, AUTH, 0)
    assert [event.id for event in events] == list(range(1, len(got) + 1))
    assert payloads(events) == got
    # Last-Event-ID: the rest after it, with the same numbers.
    rest = replayed(b, run_id, AUTH, 7)
    assert [event.id for event in rest] == list(range(8, len(got) + 1))
    assert payloads(rest) == got[7:]
    assert b.resumes() == {("replay", "ok"): 2.0}
    assert len(chaos.requests_for(model)) == 1


# -- ownership -----------------------------------------------------------------------------------


def test_another_credential_gets_a_404_on_another_replica_and_takes_nothing_over(
    anthropic_replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=60,seed=44,pace_ms=20,reasoning=2,tools=1"
    a, b = anthropic_replicas.start("A", "B")
    run_id, first = read_then_kill(a, store, model, 8)
    # The run is orphaned: whoever resumes it first takes it over, if it owns it.
    resume = {"x-run-id": run_id, "x-resume-from": str(len(first))}
    with pytest.raises(anthropic.NotFoundError) as raised:
        resume_with_sdk(b, model, resume, api_key="sk-other")
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "not_found_error", body
    url = f"{b.base_url}/runs/{run_id}/events"
    other = {"authorization": "Bearer sk-other", "last-event-id": "0"}
    assert httpx2.get(url, headers=other, timeout=DEADLINE).status_code == 404
    assert b.resumed("takeover") == 0
    assert len(chaos.requests_for(model)) == 1
    events = first + resume_with_sdk(b, model, resume)
    check_whole_answer(events, model)
    assert b.resumed("takeover") == 1


def stream_messages(
    replica: Replica,
    model: str,
    headers: dict[str, str],
    into: list[dict[str, Any]],
    stop_after: int | None = None,
) -> httpx2.Response:
    """POST a streamed ``/v1/messages`` with ``headers``, as a raw HTTP client; read its
    events into ``into`` (pings skipped, as the anthropic SDK skips them): all of them,
    or until ``into`` holds ``stop_after``. The response, its body read if not a 200."""
    body = {"model": model, "max_tokens": MAX_TOKENS, "messages": MESSAGES, "stream": True}
    with (
        httpx2.Client(timeout=DEADLINE) as http,
        http.stream("POST", replica.url + "/v1/messages", json=body, headers=headers) as response,
    ):
        if response.status_code != 200:
            response.read()
            return response
        for event in sse(response.iter_lines()):
            if event.event != "ping":
                into.extend(payloads([event]))
            if len(into) == stop_after:
                break
    return response


def test_a_run_started_with_x_api_key_is_owned_by_that_key(
    anthropic_replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=60,seed=45,pace_ms=20,reasoning=2,tools=1"
    a, b = anthropic_replicas.start("A", "B")
    first: list[dict[str, Any]] = []
    owner = {"x-api-key": API_KEY} | VERSION
    started = stream_messages(a, model, owner, first, stop_after=9)
    assert started.status_code == 200 and len(first) == 9
    run_id = started.headers["x-run-id"]
    kill_when_checkpointed_ahead(a, store, run_id, len(first))
    resume = {"x-run-id": run_id, "x-resume-from": str(len(first))}
    # Another key, or none, is another credential.
    for stranger in ({"x-api-key": "sk-ant-other"} | VERSION, VERSION):
        refused = stream_messages(b, model, stranger | resume, [])
        assert refused.status_code == 404
        assert refused.json()["error"]["type"] == "not_found_error"
        events = f"{b.base_url}/runs/{run_id}/events"
        assert httpx2.get(events, headers=stranger, timeout=DEADLINE).status_code == 404
    assert b.resumed("takeover") == 0
    events_read = list(first)
    resumed = stream_messages(b, model, owner | resume, events_read)
    assert resumed.status_code == 200
    assert resumed.headers["x-run-id"] == run_id
    check_whole_answer(events_read, model)
    assert b.resumed("takeover") == 1
    original, continuation = chaos.requests_for(model)
    # The takeover goes upstream as the first request did: with the owner's key (this
    # gateway has none of its own) and the owner's anthropic-version.
    for request in (original, continuation):
        assert request.headers["x-api-key"] == API_KEY
        assert request.headers["anthropic-version"] == VERSION["anthropic-version"]
    # The owner's key reads the finished run's events too.
    assert payloads(replayed(b, run_id, {"x-api-key": API_KEY}, 0)) == events_read

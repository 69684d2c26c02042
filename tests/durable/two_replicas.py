"""What the two-replica tests do to a client and read from Redis."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import redis
from openai import OpenAI, Stream
from openai.types.chat import ChatCompletionChunk

from gateway.chaos import RecordedRequest
from tests.api.streams import Received
from tests.processes import DEADLINE, Replica

CREDENTIAL = "sk-owner"
AUTH = {"authorization": f"Bearer {CREDENTIAL}"}


@contextlib.contextmanager
def sdk(replica: Replica) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=replica.base_url, api_key=CREDENTIAL, max_retries=0, timeout=DEADLINE
    ) as client:
        yield client


def drain(stream: Stream[ChatCompletionChunk], into: Received) -> None:
    """What a client still reads from a replica that died: what it had sent, then an error."""
    with contextlib.suppress(httpx2.HTTPError, openai.APIError), stream:
        for chunk in stream:
            into.feed(chunk)


def state(store: redis.Redis, run_id: str) -> dict[str, Any]:
    """A run's checkpoint state (``RunState``) as stored."""
    raw = store.get(f"rg:{{{run_id}}}:state")
    assert raw is not None, f"run {run_id} has no checkpoint"
    checkpoint: dict[str, Any] = orjson.loads(raw)
    return checkpoint


def lease_held(store: redis.Redis, run_id: str) -> bool:
    return bool(store.exists(f"rg:{{{run_id}}}:lease"))


def continued_prefix(request: RecordedRequest) -> str:
    """The assistant text of a continuation request (its one assistant turn)."""
    turns = request.body.get("messages") or request.body.get("input")
    assistant = [m for m in turns if isinstance(m, dict) and m.get("role") == "assistant"]
    assert len(assistant) == 1, request.body
    prefix: str = assistant[0]["content"]
    return prefix


def read_events(url: str, after: int) -> list[tuple[int, bytes]]:
    """A run's rest from ``GET /v1/runs/{id}/events`` with ``Last-Event-ID: after``:
    (id, data) of each event; every event must carry an id."""
    events: list[tuple[int, bytes]] = []
    with (
        httpx2.Client(timeout=DEADLINE) as http,
        http.stream("GET", url, headers=AUTH | {"last-event-id": str(after)}) as rest,
    ):
        assert rest.status_code == 200
        number = None
        for line in rest.iter_lines():
            if line.startswith("id: "):
                number = int(line[4:])
            elif line.startswith("data: "):
                assert number is not None, "an event without an id"
                events.append((number, line[6:].encode()))
                number = None
    return events

"""What the two-replica tests do with a client and a replica, and read from Redis."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import redis
from openai import OpenAI, Stream
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from gateway.chaos import RecordedRequest, expected_answer
from tests.api.streams import MESSAGES, Received, resume, start
from tests.api.test_responses import Streamed, check_contract
from tests.processes import DEADLINE, Replica

CREDENTIAL = "sk-owner"
AUTH = {"authorization": f"Bearer {CREDENTIAL}"}


@contextlib.contextmanager
def sdk(replica: Replica) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=replica.base_url, api_key=CREDENTIAL, max_retries=0, timeout=DEADLINE
    ) as client:
        yield client


@contextlib.contextmanager
def started(
    replica: Replica, model: str, into: Received, chunks: int
) -> Iterator[tuple[str, Stream[ChatCompletionChunk]]]:
    """A stream of ``model`` begun on ``replica`` through the SDK and read for ``chunks``
    chunks into ``into`` (``tests.api.streams.start``): its run id and the open stream,
    whose client closes on exit."""
    with sdk(replica) as client:
        yield start(client, model, into, chunks)


def start_response(client: OpenAI, model: str) -> tuple[str, Stream[ResponseStreamEvent]]:
    """A Responses stream of ``model`` started: its run id, and the stream, not read yet."""
    raw = client.responses.with_raw_response.create(model=model, input="x", stream=True)
    return raw.headers["x-run-id"], raw.parse()


def resume_on(replica: Replica, model: str, run_id: str, into: Received) -> Received:
    """The rest of a run, as the SDK reads it from ``replica`` (``tests.api.streams.resume``)."""
    with sdk(replica) as client:
        return resume(client, model, run_id, into)


@contextlib.contextmanager
def posted(replica: Replica, model: str) -> Iterator[httpx2.Response]:
    """A chat completions stream POSTed to ``replica`` as an EventSource client does
    (no SDK): the response, its body not read yet."""
    body = {"model": model, "messages": MESSAGES, "stream": True}
    url = replica.base_url + "/chat/completions"
    with (
        httpx2.Client(timeout=DEADLINE) as http,
        http.stream("POST", url, json=body, headers=AUTH) as response,
    ):
        yield response


def kill(replica: Replica, store: redis.Redis, run_id: str) -> int:
    """SIGKILL ``replica`` (frozen first, so nothing more is sent or checkpointed); its
    checkpoint's seq, which holds all its client has."""
    replica.freeze()
    time.sleep(0.05)  # a checkpoint write already on its way lands
    seq: int = state(store, run_id)["seq"]
    replica.kill()
    return seq


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


def read_rest(replica: Replica, run_id: str, after: int) -> list[bytes]:
    """A run's rest from ``replica``'s ``GET /v1/runs/{id}/events`` with ``Last-Event-ID:
    after``: the data of each event. Every event carries an id, the ids follow ``after``
    one by one, and ``[DONE]`` comes last."""
    events: list[tuple[int, bytes]] = []
    url = f"{replica.base_url}/runs/{run_id}/events"
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
    assert [n for n, _ in events] == list(range(after + 1, after + 1 + len(events)))
    assert events[-1][1] == b"[DONE]"
    return [data for _, data in events]


def check_retrieved(replica: Replica, first: list[Any], model: str) -> None:
    """The rest of a Responses stream, retrieved from ``replica`` as OpenAI documents it
    (``starting_after`` the last event of ``first``, what the client has), makes with
    ``first`` one stream saying ``model``'s whole answer, to its completion."""
    response_id = first[0].response.id
    with sdk(replica) as client:
        last = first[-1].sequence_number
        rest = list(client.responses.retrieve(response_id, stream=True, starting_after=last))
    streamed = Streamed(events=first + rest)
    check_contract(streamed)
    assert streamed.text() == expected_answer(model).text
    assert streamed.events[-1].type == "response.completed"

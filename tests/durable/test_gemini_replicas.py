"""Gemini runs across replicas: real gateway processes sharing one real Redis.

A client starts a Gemini stream on replica A and comes back on B after A was
SIGKILLed (frozen first, so it neither sends nor checkpoints any more): B takes the run
over from the checkpoint (its parts rebuilt from the events the client was sent) and
continues the upstream. What the client read before and after must be one Gemini
stream saying the uninterrupted answer, and the run belongs to the key that started it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import redis

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.chaos import gemini as chaos_gemini
from tests.api.test_gemini import check_contract, events, parts, text
from tests.durable.test_messages_replicas import kill_when_checkpointed_ahead
from tests.processes import DEADLINE, Replica, Replicas, add_upstream, replica_config
from tests.redis_server import RedisServer

KEY = "google-key-owner"
ASK = {
    "contents": [{"role": "user", "parts": [{"text": "Tell me a story."}]}],
    "generationConfig": {"thinkingConfig": {"includeThoughts": True}},
}
STREAM = "/v1beta/models/{}:streamGenerateContent?alt=sse"


@pytest.fixture
def gemini_replicas(
    chaos: ChaosUpstream, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Replicas]:
    """The replicas of ``conftest.py``, with an upstream of ``kind: gemini`` on the chaos
    server and a catch-all route to it after the openai-kind one."""
    path = replica_config(tmp_path / "gateway.yaml", chaos.base_url, redis_server.url)
    add_upstream(path, "gemini", "gemini", chaos.base_url.removesuffix("/v1") + "/v1beta")
    chaos.requests.clear()
    with Replicas(path, tmp_path) as running:
        yield running


def stream(
    replica: Replica, model: str, headers: dict[str, str], stop_after: int | None = None
) -> tuple[httpx2.Response, bytes]:
    """POST a Gemini stream to ``replica``; its raw events, all or the first ``stop_after``."""
    raw = b""
    with (
        httpx2.Client(timeout=DEADLINE) as http,
        http.stream("POST", replica.url + STREAM.format(model), json=ASK, headers=headers) as r,
    ):
        for part in r.iter_raw():
            raw += part
            if stop_after is not None and raw.count(b"\n\n") >= stop_after:
                break
        if stop_after is not None:  # whole events only: the rest of the last is lost
            raw = b"".join(e + b"\n\n" for e in raw.split(b"\n\n")[:stop_after])
    return r, raw


def check_whole_answer(chunks: list[dict[str, Any]], model: str) -> None:
    answer = expected_answer(model)
    check_contract(chunks)
    assert text(chunks) == answer.text
    assert text(chunks, thought=True) == answer.reasoning  # shown once, before the cut
    calls = [p["functionCall"] for p in parts(chunks) if "functionCall" in p]
    assert [(c["name"], c["args"]) for c in calls] == [
        (call.name, orjson.loads(call.arguments)) for call in answer.tool_calls
    ]
    (signed,) = [p for p in parts(chunks) if "thoughtSignature" in p]
    assert "functionCall" in signed and chaos_gemini.signature_valid("gemini", signed)


def test_resume_on_another_replica_after_the_owner_is_killed_takes_the_run_over(
    gemini_replicas: Replicas, chaos: ChaosUpstream, store: redis.Redis
) -> None:
    model = "chaos:text=80,seed=720,pace_ms=25,reasoning=4,tools=1"
    a, b = gemini_replicas.start("A", "B")
    owner = {"x-goog-api-key": KEY}
    started, head = stream(a, model, owner, stop_after=12)
    run_id = started.headers["x-run-id"]
    first, _ = events(head)
    assert text(first), "the client has no text yet: the kill is not mid-text"
    kill_when_checkpointed_ahead(a, store, run_id, len(first))
    resume = {"x-run-id": run_id, "x-resume-from": str(len(first))}
    refused, body = stream(b, model, {"x-goog-api-key": "someone-else"} | resume)
    assert refused.status_code == 404
    assert orjson.loads(body)["error"]["status"] == "NOT_FOUND"
    assert b.resumed("takeover") == 0
    resumed, rest = stream(b, model, owner | resume)
    assert resumed.status_code == 200 and resumed.headers["x-run-id"] == run_id
    chunks, error = events(head + rest)
    assert error is None
    check_whole_answer(chunks, model)
    assert b.resumed("takeover") == 1
    # B continued the upstream from the checkpoint: a prefill of all the client had, with
    # the owner's key (this gateway has none of its own) and the thoughts it was shown.
    original, continuation = chaos.requests_for(model)
    assert original.headers["x-goog-api-key"] == continuation.headers["x-goog-api-key"] == KEY
    model_turn = continuation.body["contents"][-1]
    assert model_turn["role"] == "model"
    said = "".join(p["text"] for p in model_turn["parts"] if not p.get("thought"))
    assert said.startswith(text(first).rstrip())  # at least what the client read
    assert expected_answer(model).text.startswith(said)
    # A takeover does not know who signed what the client holds: no signature goes back.
    assert not any("thoughtSignature" in p for p in model_turn["parts"])

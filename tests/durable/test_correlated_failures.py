"""A Redis primary and the gateway replica relaying the runs, lost together.

Two gateway replicas on a real Redis Sentinel or Cluster (with replicas), in
front of a chaos upstream whose every request chunks (``rechunk``) or words
(``sample``) its answer otherwise. Streams run on replica A; the Redis primary
holding them is SIGKILLed (with its replica frozen for a second first, as a
lagging replica is, or not), then A is SIGKILLed, and every client resumes on B
by one of the doors: ``x-resume-from`` (the openai SDK), ``Last-Event-ID``
(``GET /v1/runs/{id}/events``) and ``starting_after`` (Responses).

Each stream must end byte-exact, or with the explicit ``resume_not_exact`` error:
never silently wrong. Before issue 29, with a lagging replica, most were wrong:
the old primary had acknowledged writes its replica never got, clients had been
released those events, and B skipped by count into its new leg's other text.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import openai
import orjson
import pytest

from gateway.chaos import ChaosUpstream, expected_answer
from tests.api.streams import MESSAGES
from tests.durable.two_replicas import AUTH, sdk
from tests.processes import DEADLINE, Replica, Replicas, replica_config
from tests.redis_cluster import RedisClusterNodes
from tests.redis_server import RedisSentinels, RedisServer

STREAMS = 12
DOORS = ["x-resume-from", "last-event-id", "starting_after"]
PRIMARY_KILLED_AT = 2.5  # seconds after the streams started
OWNER_KILLED_AFTER = 1.0  # seconds after the primary: before its replica is promoted
LAG = 1.0  # seconds the primary's replica is frozen before the primary is killed
STORE_BACK = 20.0  # seconds a resume is retried while the store fails over (503)


@dataclass
class Client:
    """One stream: what it read from A, then from B, and how it ended."""

    model: str
    door: str
    run_id: str = ""
    response_id: str = ""
    held: str = ""  # the text it had when A died
    held_events: int = 0  # the events it had (its resume position)
    last_sequence: int = -1  # Responses: the sequence_number of its last event
    text: str = ""
    finishes: list[str] = field(default_factory=list)
    refused: bool = False  # ended with resume_not_exact
    error: str | None = None  # ended with any other error
    started: threading.Event = field(default_factory=threading.Event)


def models(seed: int) -> list[str]:
    return [
        f"chaos:text=600,seed={seed + i},pace_ms=20,{'rechunk' if i % 2 else 'sample'}=1"
        for i in range(STREAMS)
    ]


# -- one client's two halves -------------------------------------------------------------------


def chat_text(payload: bytes, client: Client) -> None:
    if payload == b"[DONE]":
        return
    chunk = orjson.loads(payload)
    if "error" in chunk:
        raise InBand(chunk["error"])
    for choice in chunk["choices"]:
        client.text += choice["delta"].get("content") or ""
        if choice.get("finish_reason"):
            client.finishes.append(choice["finish_reason"])


class InBand(Exception):
    """An error the gateway sent: in band, or as the status of a raw request."""

    def __init__(self, error: dict[str, object], status: int | None = None) -> None:
        super().__init__(str(error.get("message")))
        self.code = error.get("code")
        self.status = status


def read_from_a(a: Replica, client: Client) -> None:
    """Stream from A until A dies (its socket resets)."""
    with contextlib.suppress(httpx2.HTTPError, openai.APIError):
        if client.door == "starting_after":
            with sdk(a) as openai_client:
                raw = openai_client.responses.with_raw_response.create(
                    model=client.model, input="x", stream=True
                )
                client.run_id = raw.headers["x-run-id"]
                with raw.parse() as stream:
                    for event in stream:
                        if event.type == "response.created":
                            client.response_id = event.response.id
                            client.started.set()
                        elif event.type == "response.output_text.delta":
                            client.text += event.delta
                        client.last_sequence = event.sequence_number
                        client.held_events += 1
            return
        body = {"model": client.model, "messages": MESSAGES, "stream": True}
        with (
            httpx2.Client(timeout=DEADLINE) as http,
            http.stream("POST", a.base_url + "/chat/completions", json=body, headers=AUTH) as r,
        ):
            client.run_id = r.headers["x-run-id"]
            client.started.set()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chat_text(line[6:].encode(), client)
                    client.held_events += 1


def resume_on_b(b: Replica, client: Client) -> None:
    """Resume by the client's door with what it holds, as often as B answers 503 (its
    store is failing over), as the SDKs do; record how it ended."""
    deadline = time.monotonic() + STORE_BACK
    while True:
        text, finishes = client.text, list(client.finishes)
        resume_once(b, client)
        if not (client.error or "").startswith("503") or time.monotonic() > deadline:
            return
        client.text, client.finishes, client.error = text, finishes, None
        time.sleep(0.2)


def resume_once(b: Replica, client: Client) -> None:
    try:
        if client.door == "starting_after":
            with sdk(b) as openai_client:
                rest = openai_client.responses.retrieve(
                    client.response_id, stream=True, starting_after=client.last_sequence
                )
                for event in rest:
                    if event.type == "response.output_text.delta":
                        client.text += event.delta
                    elif event.type == "response.completed":
                        client.finishes.append("stop")
                    elif event.type == "error":
                        raise InBand({"code": event.code, "message": event.message})
        elif client.door == "x-resume-from":
            headers = {"x-run-id": client.run_id, "x-resume-from": str(client.held_events)}
            with sdk(b) as openai_client:
                stream = openai_client.chat.completions.create(
                    model=client.model, messages=MESSAGES, stream=True, extra_headers=headers
                )
                for chunk in stream:
                    for choice in chunk.choices:
                        client.text += choice.delta.content or ""
                        if choice.finish_reason:
                            client.finishes.append(choice.finish_reason)
        else:
            url = f"{b.base_url}/runs/{client.run_id}/events"
            headers = AUTH | {"last-event-id": str(client.held_events)}
            with (
                httpx2.Client(timeout=DEADLINE) as http,
                http.stream("GET", url, headers=headers) as r,
            ):
                if r.status_code != 200:
                    r.read()
                    raise InBand(r.json()["error"], r.status_code)
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        chat_text(line[6:].encode(), client)
    except (InBand, openai.APIError) as exc:
        status = exc.status if isinstance(exc, InBand) else getattr(exc, "status_code", None)
        if exc.code == "resume_not_exact":
            client.refused = True
        else:
            client.error = f"{status} {client.door} {type(exc).__name__}: {exc}"


# -- the verdict -------------------------------------------------------------------------------


def verdict(chaos: ChaosUpstream, client: Client) -> str:
    """exact, refused (the explicit error), error (another one) or wrong."""
    if client.refused:
        return "refused"
    if client.error is not None:
        return "error"
    requests = chaos.requests_for(client.model)
    last = requests[-1]
    assert last.prefix is not None and last.answered_text is not None
    exact = (
        client.finishes == ["stop"]
        and last.prefix.startswith(client.held)
        and client.text == last.prefix + last.answered_text
    )
    if "rechunk" in client.model:
        exact = exact and client.text == expected_answer(client.model).text
    return "exact" if exact else "wrong"


# -- the topologies ----------------------------------------------------------------------------


def primary_and_replica(
    topology: RedisSentinels | RedisClusterNodes, run_ids: list[str]
) -> tuple[RedisServer, RedisServer]:
    """The primary holding most of the runs (the only one on Sentinel), and its replica."""
    if isinstance(topology, RedisSentinels):
        primary = topology.primary()
        return primary, next(s for s in topology.servers if s is not primary)
    holders = Counter(port_of_primary(topology, run_id) for run_id in run_ids)
    primary = topology.node(holders.most_common(1)[0][0])
    return primary, topology.replica_of(primary)


def port_of_primary(topology: RedisClusterNodes, run_id: str) -> int:
    return int(topology.primary_of(f"rg:{{{run_id}}}:state").url.rsplit(":", 1)[1].split("/")[0])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lagging", [False, True], ids=["replica_in_step", "replica_lagging"])
def test_a_redis_primary_and_the_owner_replica_lost_together_leave_no_answer_silently_wrong(
    topology: RedisSentinels | RedisClusterNodes,
    chaos: ChaosUpstream,
    tmp_path: Path,
    lagging: bool,
) -> None:
    config = replica_config(tmp_path / "gateway.yaml", chaos.base_url, topology.url)
    seed = 900 + 50 * lagging + 100 * isinstance(topology, RedisClusterNodes)
    clients = [Client(model, DOORS[i % len(DOORS)]) for i, model in enumerate(models(seed))]
    with Replicas(config, tmp_path) as replicas, ThreadPoolExecutor(STREAMS) as pool:
        a, b = replicas.start("A", "B")
        began = time.monotonic()
        firsts = [pool.submit(read_from_a, a, client) for client in clients]
        for client in clients:
            assert client.started.wait(DEADLINE), "a stream did not start"
        primary, replica = primary_and_replica(topology, [c.run_id for c in clients])
        time.sleep(max(0.0, began + PRIMARY_KILLED_AT - (LAG if lagging else 0) - time.monotonic()))
        assert primary.process is not None and replica.process is not None
        if lagging:
            replica.process.send_signal(signal.SIGSTOP)  # it stops acknowledging
            time.sleep(LAG)
        primary.process.kill()
        primary.process.wait(10)
        if lagging:
            replica.process.send_signal(signal.SIGCONT)  # promoted, without the last writes
        time.sleep(OWNER_KILLED_AFTER)
        a.freeze()
        a.kill()
        for first in firsts:
            first.result(timeout=DEADLINE)
        for client in clients:
            assert not client.finishes, "an answer finished on A before A was killed"
            client.held = client.text
        list(pool.map(lambda client: resume_on_b(b, client), clients, timeout=60))
    verdicts = Counter(verdict(chaos, client) for client in clients)
    print(f"\n{type(topology).__name__} lagging={lagging}: {dict(verdicts)}")
    errors = [client.error for client in clients if client.error]
    assert verdicts["wrong"] == 0, (verdicts, [c.model for c in clients])
    assert not errors, errors
    # Within unprotected_after, every client stays within what the promoted replica holds:
    # none needs the explicit refusal either.
    assert verdicts["exact"] == STREAMS, verdicts

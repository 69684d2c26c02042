"""A rolling update loses no run: replicas of two consecutive releases share one Redis.

While a Deployment rolls, a run started on a replica of one release is taken over by
a replica of the other when its own is killed (or drained), in both directions. So
every release reads the previous release's records and the next one's: fields it does
not know are ignored, fields missing are defaulted, and what it cannot continue (a
newer format, a protocol it does not speak, a damaged field) is refused with an
explicit 503, never a crash or a guess.

The unit tests below decode records exactly as the previous release wrote them, and as
a next release might (more fields, at the top and nested). The cross-version tests run
the previous release itself: its source, extracted from git (``PREVIOUS``) into a temp
folder, started with this checkout's interpreter and ``PYTHONPATH`` pointing at it (the
runtime dependencies are the same), beside a replica of this checkout on one real
redis-server; each is SIGKILLed mid-stream in turn and the other must finish the
answer exactly. They are skipped only where git or that commit is missing (a shallow
clone: ``git fetch --unshallow`` brings it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import httpx2
import orjson
import pytest
import redis

from gateway.chaos import ChaosUpstream
from gateway.checkpoint.model import (
    _CALL,
    _RECORD,
    _STATE,
    FORMAT,
    InFlightCall,
    RunRecord,
    RunState,
    RunUnreadable,
)
from gateway.protocols import adapter_named
from tests.api.streams import MESSAGES, Received, assert_whole_text_answer
from tests.durable.two_replicas import AUTH, drain, kill, resume_on, started, state
from tests.processes import DEADLINE, Replica, Replicas, ready, replica_config, wait_until
from tests.redis_server import RedisServer
from tests.servers import free_port

# The previous release: the last landed commit before this one's changes. Bump it when
# a release lands (docs/operations.md, "Upgrading").
PREVIOUS = "c28adeb8cba24101fe5717c4268b93703b565d8f"
ROOT = Path(__file__).resolve().parents[2]

# -- records of the previous release and of a next one -------------------------------------

# Exactly as the previous release's RunRecord.encode and RunState.encode wrote them (its
# model.py run on these values): no version field.
PREVIOUS_RECORD = (
    b'{"run_id":"run-1","owner":"oooooooo","route":"default","body":{"model":"gpt-4o",'
    b'"messages":[{"role":"user","content":"hi"}],"stream":true},"created":1764300000.5,'
    b'"protocol":"chat","query":"api-version=1","fallbacks":["backup"],'
    b'"trace":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
)
PREVIOUS_STATE = (
    b'{"seq":12,"status":"detached","leg":1,"splice_leg":1,"usage_by_leg":{"0":'
    b'{"prompt_tokens":5}},"estimated_by_leg":{"1":{"completion_tokens":7}},"in_flight":'
    b'[{"name":"lookup","arguments":"{\\"q\\": \\"x"}],"text_chars":40,"reasoning_chars":3,'
    b'"tool_calls":1,"cause":"reset","updated":1764300001.25}'
)


def test_the_previous_releases_record_and_state_decode() -> None:
    record = RunRecord.decode(PREVIOUS_RECORD)
    assert record == RunRecord(
        "run-1",
        "oooooooo",
        "default",
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        1764300000.5,
        "chat",
        "api-version=1",
        ["backup"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert record.version == 1 == FORMAT
    decoded = RunState.decode(PREVIOUS_STATE)
    assert decoded == RunState(
        seq=12,
        status="detached",
        leg=1,
        splice_leg=1,
        usage_by_leg={"0": {"prompt_tokens": 5}},
        estimated_by_leg={"1": {"completion_tokens": 7}},
        in_flight=[InFlightCall("lookup", '{"q": "x')],
        text_chars=40,
        reasoning_chars=3,
        tool_calls=1,
        cause="reset",
        updated=1764300001.25,
    )
    # What this release writes, the previous one reads: the same fields, and a version,
    # an acknowledged count and the output spent, which it ignores (its decode kept only
    # the fields it knew).
    assert orjson.loads(record.encode()) == orjson.loads(PREVIOUS_RECORD) | {"version": 1}
    expected = orjson.loads(PREVIOUS_STATE) | {
        "version": 1,
        "acked": None,
        "output_spent": None,
        "background": None,
    }
    assert orjson.loads(decoded.encode()) == expected


def test_a_next_releases_record_and_state_decode() -> None:
    """More fields, at the top and nested, of the same format: ignored; fewer: defaulted."""
    record = orjson.loads(PREVIOUS_RECORD) | {"version": 1, "tenant": "t", "limits": {"x": 1}}
    del record["query"], record["trace"], record["route"]
    decoded = RunRecord.decode(orjson.dumps(record))
    assert (decoded.query, decoded.trace, decoded.route) == ("", None, "")
    assert decoded.fallbacks == ["backup"] and decoded.version == 1
    next_state = {
        "seq": 3,
        "status": "paused",  # a status of its own: carried as it is
        "in_flight": [{"name": "f", "arguments": "{", "id": "call_1"}, {"arguments": "{"}, {}],
        "usage_by_leg": {"0": {"total_tokens": 9, "details": {"cached": 1}}},
        "log_bytes": 123,
        "version": 1,
    }
    loaded = RunState.decode(orjson.dumps(next_state))
    assert loaded.in_flight == [
        InFlightCall("f", "{"),
        InFlightCall("", "{"),
        InFlightCall("", ""),
    ]
    assert (loaded.seq, loaded.status, loaded.leg, loaded.splice_leg) == (3, "paused", 0, 0)
    assert loaded.estimated_by_leg == {} and loaded.cause is None and loaded.text_chars == 0
    # Nulls where a value has a default read as missing.
    assert RunState.decode(b'{"in_flight": null, "seq": null}') == RunState(0, "running", 0, 0)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"owner": "o", "body": {}, "version": 2}', "version 2"),
        (b'{"owner": "o", "body": {}, "query": 7}', "'query' is int"),
        (b'{"owner": "o", "body": {}, "fallbacks": "backup"}', "'fallbacks' is str"),
        (b'{"owner": "o", "body": []}', "'body' is list"),
        (b'{"body": {}}', "no 'owner'"),
        (b"[1]", "not a JSON object"),
        (b"{not json", "not a JSON object"),
    ],
)
def test_a_record_this_release_cannot_continue_is_refused_explicitly(raw: bytes, why: str) -> None:
    with pytest.raises(RunUnreadable, match=why) as refused:
        RunRecord.decode(raw)
    assert refused.value.status_code == 503 and refused.value.code == "run_unreadable"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"version": 2}', "version 2"),
        (b'{"in_flight": {"name": "f"}}', "'in_flight' is dict"),
        (b'{"in_flight": [["f", "{"]]}', "not a JSON object"),
        (b'{"in_flight": [{"name": 1}]}', "'name' is int"),
        (b'{"usage_by_leg": {"first": {}}}', "'usage_by_leg'"),
        ('{"estimated_by_leg": {"²": {}}}'.encode(), "'estimated_by_leg'"),
        (b'{"leg": "1"}', "'leg' is str"),
        (b'{"seq": true}', "'seq' is bool"),
    ],
)
def test_a_state_this_release_cannot_continue_is_refused_explicitly(raw: bytes, why: str) -> None:
    with pytest.raises(RunUnreadable, match=why):
        RunState.decode(raw)


def test_every_field_is_read_back() -> None:
    """A field added to a record is added to what decode reads, or it would be dropped."""
    assert set(_RECORD) == {f.name for f in fields(RunRecord)}
    assert set(_STATE) == {f.name for f in fields(RunState)}
    assert set(_CALL) == {f.name for f in fields(InFlightCall)}


def test_a_protocol_this_release_does_not_speak_is_refused_explicitly() -> None:
    with pytest.raises(RunUnreadable, match="'bard'") as refused:
        adapter_named("bard")
    assert refused.value.status_code == 503


# -- the previous release itself, beside this one --------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's source in a temp folder (``git archive``: nothing is added
    to the repository, no worktree is left behind if the run is killed)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the previous release cannot be checked out")
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: the previous release cannot be checked out")
    if _git("cat-file", "-e", f"{PREVIOUS}^{{commit}}").returncode != 0:
        pytest.skip(
            f"the previous release ({PREVIOUS[:7]}) is not in this clone (a shallow "
            "clone?): `git fetch --unshallow` brings it"
        )
    source = tmp_path_factory.mktemp("previous-release")
    archive = source / "source.tar"
    made = _git("archive", "--format=tar", "-o", str(archive), PREVIOUS, "gateway")
    assert made.returncode == 0, made.stderr
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    archive.unlink()
    # Its own package, not this checkout's editable install: PYTHONPATH comes first.
    imported = subprocess.run(
        [sys.executable, "-c", "import gateway.app; print(gateway.__file__)"],
        cwd=source,
        env=_env(source),
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert Path(imported.stdout.decode().strip()) == source / "gateway" / "__init__.py"
    return source


def _env(source: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(source)}


def start_previous(replicas: Replicas, source: Path, name: str) -> Replica:
    """A replica of the previous release (``python -m gateway serve``) with this config."""
    port = free_port()
    log = replicas.directory / f"gateway-{name}.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(replicas.config)]
            + ["--port", str(port), "--workers", "1", "--log-level", "warning"],
            cwd=source,  # python -m puts the working folder first on sys.path
            env=_env(source),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    replica = Replica(name, f"http://127.0.0.1:{port}", process, log)
    replicas.started.append(replica)  # stopped with the others
    wait_until(lambda: ready(replica), f"gateway {name} ready")
    return replica


@pytest.fixture
def both(
    chaos: ChaosUpstream, redis_server: RedisServer, previous_release: Path, tmp_path: Path
) -> Iterator[dict[str, Replica]]:
    """A replica of the previous release and one of this checkout, on one Redis."""
    config = replica_config(tmp_path / "gateway.yaml", chaos.base_url, redis_server.url)
    chaos.requests.clear()
    with Replicas(config, tmp_path) as replicas:
        previous = start_previous(replicas, previous_release, "previous")
        (current,) = replicas.start("current")
        yield {"previous": previous, "current": current}


@pytest.mark.parametrize(
    ("first", "then"), [("previous", "current"), ("current", "previous")], ids=["up", "down"]
)
def test_a_run_is_taken_over_exactly_across_releases(
    both: dict[str, Replica], chaos: ChaosUpstream, store: redis.Redis, first: str, then: str
) -> None:
    model = f"chaos:text=300,seed={41 if first == 'previous' else 42},pace_ms=15,rechunk=1"
    owner, heir = both[first], both[then]
    received = Received()
    with started(owner, model, received, 12) as (run_id, stream):
        assert state(store, run_id)["seq"] >= received.chunks  # the store is ahead
        seq = kill(owner, store, run_id)
        drain(stream, received)
    assert received.chunks <= seq and received.finish_reasons == [], "killed mid-stream"
    resume_on(heir, model, run_id, received)
    assert_whole_text_answer(received, model)  # exactly the fault-free answer
    assert heir.resumed("takeover") == 1
    assert len(chaos.requests_for(model)) == 2  # the first leg, and the heir's continuation
    assert state(store, run_id)["status"] == "done"


def test_a_run_this_release_cannot_continue_gets_an_explicit_error(
    both: dict[str, Replica], store: redis.Redis
) -> None:
    """A stored run of an unknown protocol or a newer format: 503 ``run_unreadable``.
    (Started on the other replica: this one reads it from the store, not from memory.)"""
    current = both["current"]
    model = "chaos:text=20,seed=43"
    with started(both["previous"], model, Received(), 2) as (run_id, stream):
        stream.close()
    wait_until(lambda: state(store, run_id)["status"] == "done", "the run finished")
    key = f"rg:{{{run_id}}}:record"
    raw = store.get(key)
    assert raw is not None
    record = orjson.loads(raw)
    for changed in ({"protocol": "bard"}, {"version": FORMAT + 1}):
        store.set(key, orjson.dumps(record | changed), keepttl=True)
        body = {"model": model, "messages": MESSAGES, "stream": True}
        headers = AUTH | {"x-run-id": run_id, "x-resume-from": "1"}
        answer = httpx2.post(
            current.base_url + "/chat/completions", json=body, headers=headers, timeout=DEADLINE
        )
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "run_unreadable"

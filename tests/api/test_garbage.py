"""A finished run is freed at once, by reference counting: not left for the collector.

The collector's full passes stop the event loop for as long as they take to walk
every live object: at 256 streams that was up to 73 ms, added to every stream's
gap at once (BENCHMARKS.md, "Collector pauses"). A run left in a reference cycle
is freed only by such a pass, and until then its prompt and answer stay in
memory; so is one held by something that outlives it (an idle connection). Here
the collector is off while runs go through the gateway: whatever of them is still
alive afterwards is held by a cycle or by something else it should not be.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx2
import pytest
from openai import OpenAI

from gateway.app import CONFIG_ENV, create_app_from_env
from gateway.chaos import ChaosUpstream, expected_answer
from gateway.runs.durable import LocalRun
from gateway.runs.log import RunLog
from gateway.runs.run import Run
from gateway.upstream.connection import Connection
from tests.api.streams import MESSAGES, stream_chat
from tests.servers import gateway_config, running_gateway, wait_for

RUN_TYPES = (LocalRun, Run, RunLog)
FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.02, "idle_retry_delay": 0.01}


def alive() -> list[object]:
    return [o for o in gc.get_objects() if isinstance(o, RUN_TYPES)]


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def sdk(chaos: ChaosUpstream) -> Iterator[OpenAI]:
    config = gateway_config(
        chaos.base_url,
        upstream={"timeouts": {"connect": 2, "first_byte": 3, "idle": 0.3}},
        routes=[{"match": "*", "upstream": "chaos", "retry": FAST_RETRY}],
    )
    with (
        running_gateway(config) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client,
    ):
        yield client


@pytest.mark.usefixtures("collector_off")
@pytest.mark.parametrize(
    "model",
    [
        "chaos:text=20,seed=40",
        "chaos:text=20,seed=41,fault=reset,at=8,times=1",  # ContinueText
        "chaos:text=20,seed=42,fault=stall,at=8,times=1",  # idle timeout
        "chaos:text=20,seed=43,fault=error,at=8,times=1",  # in-band error event
        "chaos:text=3,tools=2,arg_deltas=4,seed=44,fault=reset,at=6,times=1",
    ],
    ids=["whole", "reset", "stall", "in-band-error", "tool-calls"],
)
def test_a_streamed_run_is_freed_when_it_ends(sdk: OpenAI, model: str) -> None:
    assert stream_chat(sdk, model).text == expected_answer(model).text
    assert wait_for(lambda: not alive(), timeout=3, message="a run outlived its stream")


@pytest.mark.usefixtures("collector_off")
def test_a_non_streaming_run_is_freed_when_it_ends(sdk: OpenAI) -> None:
    model = "chaos:text=20,seed=45,fault=reset,at=8,times=1"
    completion = sdk.chat.completions.create(model=model, messages=MESSAGES)
    assert completion.choices[0].message.content == expected_answer(model).text
    assert wait_for(lambda: not alive(), timeout=3, message="a run outlived its request")


@pytest.mark.usefixtures("collector_off")
def test_a_run_whose_client_left_is_freed_when_cancelled(chaos: ChaosUpstream) -> None:
    # No detach grace: the run is cancelled as soon as its only client leaves.
    config = gateway_config(chaos.base_url, state={"detach_grace": 0})
    with running_gateway(config) as gateway:
        body = {"model": "chaos:text=200,seed=46,pace_ms=20", "messages": MESSAGES, "stream": True}
        url = gateway.base_url + "/chat/completions"
        with httpx2.stream("POST", url, json=body, headers={"authorization": "Bearer k"}) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    break
        assert wait_for(lambda: not alive(), timeout=3, message="a cancelled run stayed")
        # Its upstream connection was closed, not left for the collector either.
        assert wait_for(lambda: not _open_connections(), timeout=3)


def _open_connections() -> list[object]:
    return [o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed]


def test_the_served_app_freezes_its_startup_heap_out_of_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What ``serve`` runs in each worker: modules, classes and config, allocated once,
    # are never walked again by the collector's full passes.
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    gc.unfreeze()
    try:
        create_app_from_env()
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()

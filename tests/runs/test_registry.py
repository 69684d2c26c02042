"""The runs of one process and the names clients know them by (pure units: no I/O)."""

from __future__ import annotations

import types

import pytest

from gateway.config.load import default_config
from gateway.metrics import Metrics
from gateway.runs.durable import LocalRun
from gateway.runs.registry import Runs


def ended_run(runs: Runs, status: str) -> LocalRun:
    """A run named by a response id that was recovered (its second leg) and ended."""
    run = types.SimpleNamespace(splicer=types.SimpleNamespace(leg=1))
    local = types.SimpleNamespace(
        id="run_1",
        alias=None,
        run=run,
        lost=False,
        status=status,
        held=False,
        log=types.SimpleNamespace(size=0),
    )
    runs.local["run_1"] = local  # type: ignore[assignment]
    runs.alias("resp_1", local)  # type: ignore[arg-type]
    runs.ended(local)  # type: ignore[arg-type]
    return local  # type: ignore[return-value]


@pytest.mark.anyio
async def test_a_detached_run_without_a_store_is_forgotten_with_its_name() -> None:
    # Its log, body and accumulator must not stay behind, nor its name find it.
    runs = Runs(default_config().state.model_copy(update={"store": "off"}), None, metrics=Metrics())
    ended_run(runs, "detached")
    assert "run_1" not in runs.local
    assert await runs.aliases.lookup("resp_1") is None


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

"""The ids clients saw for runs: a Responses response id finds its run on any replica.

A client names a Responses answer by the response's own id (``GET
/v1/responses/{id}``, ``previous_response_id``), never by the run id. The gateway
keeps that name for the run, here while this process relays it and in the store for
the others, and remembers which answers were recovered: their upstream's stored copy
ends where the stream broke, so a later turn must not lean on it (docs/protocols/
responses.md, "`store` and `previous_response_id` after a recovery").
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gateway.checkpoint.store import CheckpointStore
from gateway.config.schema import State
from gateway.errors import ServiceUnavailable

if TYPE_CHECKING:
    from gateway.runs.durable import LocalRun
    from gateway.runs.run import Run

logger = logging.getLogger("gateway.resume")

# How long the gateway remembers that an answer it served was recovered (its upstream's
# stored copy ends where the stream broke): as long as OpenAI keeps stored responses.
RECOVERED_ALIAS_TTL = 30 * 24 * 3600.0
RECOVERED = " recovered"  # the alias's value: "<run id>", or "<run id> recovered"

# A recovered non-streaming answer, which has no run log: (credential, request, answer).
Assembled = tuple[str | None, dict[str, Any], dict[str, Any]]


class Aliases:
    def __init__(self, config: State, store: CheckpointStore | None) -> None:
        self._config = config
        self._store = store
        self._live: dict[str, LocalRun] = {}  # the names of the runs this process relays
        self._assembled: dict[str, Assembled] = {}  # for completed_ttl
        self._writes: set[asyncio.Task[None]] = set()

    def name(self, name: object, local: LocalRun) -> None:
        """Let ``name``, the answer's own id, find ``local``'s run (on any replica)."""
        if not isinstance(name, str) or not name:
            return
        local.alias = name
        self._live[name] = local
        self._store_alias(name, local.id, self._config.ttl)

    def ended(self, local: LocalRun) -> None:
        """``local``'s run ended: a recovered answer is remembered as such, long after."""
        if local.alias is None:
            return
        if self._store is not None:  # else the name goes with the local run (``forget``)
            self._live.pop(local.alias, None)
        if local.run.splicer.leg > 0 and not local.lost:
            self._store_alias(local.alias, local.id + RECOVERED, RECOVERED_ALIAS_TTL)

    def forget(self, local: LocalRun) -> None:
        if local.alias is not None:
            self._live.pop(local.alias, None)

    def assembled(self, run: Run, credential: str | None, answer: dict[str, Any]) -> None:
        """A non-streaming answer was served: if it was recovered, remember so (section 2a)."""
        name = (run.accumulator.identity or {}).get("id")
        if not run.adapter.aliased or run.splicer.leg == 0 or not isinstance(name, str):
            return
        self._assembled[name] = (credential, run.body, answer)
        loop = asyncio.get_running_loop()
        loop.call_later(self._config.completed_ttl, self._assembled.pop, name, None)
        self._store_alias(name, run.id + RECOVERED, RECOVERED_ALIAS_TTL)

    def assembled_answer(self, name: str) -> Assembled | None:
        return self._assembled.get(name)

    async def lookup(self, name: str) -> tuple[str, bool] | None:
        """The run a public id names, and whether its answer was recovered; None if
        unknown (never served here, or forgotten)."""
        local = self._live.get(name)
        if local is not None:
            return local.id, local.run.splicer.leg > 0
        if name in self._assembled:
            return name, True
        if self._store is None:
            return None
        try:
            value = await self._store.get_alias(name)
        except Exception as exc:  # noqa: BLE001
            raise ServiceUnavailable(
                f"The checkpoint store is unavailable ({type(exc).__name__})."
            ) from None
        if value is None:
            return None
        run_id, _, recovered = value.partition(" ")
        return run_id, bool(recovered)

    def _store_alias(self, name: str, value: str, ttl: float) -> None:
        if self._store is None:
            return
        task = asyncio.get_running_loop().create_task(self._write(self._store, name, value, ttl))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    @staticmethod
    async def _write(store: CheckpointStore, name: str, value: str, ttl: float) -> None:
        try:
            await store.set_alias(name, value, ttl)
        except Exception as exc:  # noqa: BLE001 - the store is down: resume by run id still works
            logger.warning("alias not stored", extra={"error": type(exc).__name__})

    async def aclose(self) -> None:
        """Wait for the names being written."""
        await asyncio.gather(*self._writes, return_exceptions=True)

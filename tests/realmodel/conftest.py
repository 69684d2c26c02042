"""A real model on real inference servers: SmolLM2-135M-Instruct on llama.cpp
(``probes.realmodel``), for tests whose claim is about an answer a model really gave.

- ``llama_a``, ``llama_b``: two servers, one per session (``LlamaServer``: ``.url``,
  ``.base_url``, ``.port``, ``.kill()``, ``.restart()``). A test may SIGKILL one: it is
  started again, on the same port, once the test is over.
- ``cutting_proxy``: a ``CuttingProxy`` in front of ``llama_a`` (``.url``), fresh for
  each test; ``cutting_proxy.arm(5, "reset")`` breaks the next response after 5 events.

The model and xllamacpp come from ``scripts/install`` (the test command runs it): if
either is missing the fixtures fail, saying so, rather than skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from probes.realmodel.cut import CuttingProxy
from probes.realmodel.server import LlamaServer, RealModelMissing, check_installed

_servers: list[LlamaServer] = []  # the session's, revived after a test that killed one


@pytest.fixture(scope="session")
def realmodel_gguf() -> Path:
    try:
        return check_installed()
    except RealModelMissing as exc:
        pytest.fail(str(exc), pytrace=False)


def _serving(gguf: Path) -> Iterator[LlamaServer]:
    """A server for the session, revived after a test that killed it."""
    with LlamaServer(gguf) as server:
        _servers.append(server)
        yield server
        _servers.remove(server)


@pytest.fixture(scope="session")
def llama_a(realmodel_gguf: Path) -> Iterator[LlamaServer]:
    yield from _serving(realmodel_gguf)


@pytest.fixture(scope="session")
def llama_b(realmodel_gguf: Path) -> Iterator[LlamaServer]:
    yield from _serving(realmodel_gguf)


@pytest.fixture(autouse=True)
def _revive_killed_servers() -> Iterator[None]:
    yield
    for server in _servers:
        if not server.alive:
            server.restart()


@pytest.fixture
def cutting_proxy(llama_a: LlamaServer) -> Iterator[CuttingProxy]:
    with CuttingProxy(llama_a.port) as proxy:
        yield proxy

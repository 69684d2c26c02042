"""``serve --workers N``: a replica killed whole takes its workers with it.

SIGKILL reaches only the supervisor (an OOM kill, ``kill -9``, a container runtime
that kills the main process). Its workers must not go on serving and owning their
runs: they are killed with it (``gateway/supervisor.py``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx2
import pytest

from gateway.chaos import ChaosUpstream
from tests.processes import Replicas, wait_until


def children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(child) for child in text.split()}


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody reaped yet."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "Z" not in state.split()[1]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_workers_die_with_a_killed_supervisor(chaos: ChaosUpstream, tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(f"upstreams: [{{name: chaos, base_url: '{chaos.base_url}'}}]\n")
    with Replicas(config, tmp_path) as replicas:
        [replica] = replicas.start("workers", args=["--workers", "2", "--log-level", "warning"])
        supervisor = replica.process.pid
        wait_until(lambda: len(children(supervisor)) >= 2, "two workers started")
        workers = children(supervisor)
        # A long answer in progress on one of the workers.
        body = {"model": "chaos:text=400,pace_ms=20", "messages": [], "stream": True}
        ended = threading.Event()

        def read() -> None:
            try:
                with httpx2.stream("POST", replica.base_url + "/chat/completions", json=body) as r:
                    for _ in r.iter_bytes():
                        pass
            except httpx2.HTTPError:
                pass
            ended.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.5)
        assert not ended.is_set()
        os.kill(supervisor, signal.SIGKILL)
        replica.process.wait(10)
        wait_until(lambda: not any(alive(pid) for pid in workers), "the workers are gone", 5)
        assert ended.wait(5), "the stream went on after its replica was killed"
        with pytest.raises(httpx2.ConnectError):
            httpx2.get(replica.url + "/healthz", timeout=2)

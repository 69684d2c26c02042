"""Processes for benchmarks: ports, spawning (pinned to CPUs), readiness, and /proc readings."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx2
import orjson

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_ports(count: int) -> list[int]:
    """Distinct free ports (all bound at once, so the kernel cannot hand one out twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def pinned(args: list[str], cpus: str | None) -> list[str]:
    """``args`` under ``taskset -c cpus`` (unchanged when cpus is None)."""
    return args if cpus is None else ["taskset", "-c", cpus, *args]


@contextlib.contextmanager
def spawned(
    args: list[str], env: Mapping[str, str] | None = None, log: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, terminated (then killed) on the way out, whatever happens.

    Its output goes to ``log`` (or nowhere): a chatty child must never block on a pipe.
    """
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("wb")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=out if log is not None else None,
            env=env,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_ready(
    proc: subprocess.Popen[bytes],
    probe: Callable[[], bool],
    what: str,
    timeout: float = 60,
    log: Path | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        problem = None
        if proc.poll() is not None:
            problem = f"{what} exited with status {proc.returncode} before it was ready"
        elif time.monotonic() > deadline:
            problem = f"{what} not ready after {timeout:.0f} s"
        if problem is not None:
            if log is not None and log.exists():
                tail = log.read_text(errors="replace").splitlines()[-20:]
                problem += "; the end of its output:\n" + "\n".join(tail)
            raise SystemExit(problem)
        time.sleep(0.1)


def http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return httpx2.get(url, timeout=2).status_code == 200
        except httpx2.HTTPError:
            return False

    return probe


def redis_ok(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    return probe


def machine_busy() -> float:
    """CPU seconds all cores spent busy since boot (processes, interrupts, steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants, as they are now (a proxy may fork workers)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            parents[int(stat.parent.name)] = int(text[text.rindex(")") + 2 :].split()[1])
    found, frontier = [pid], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def memory_kb(pid: int, field: str) -> int:
    """A line of /proc/PID/status in KB: ``VmRSS`` (now) or ``VmHWM`` (peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PHYS_PAGES") * PAGE / 2**30
    redis = "not found"
    if shutil.which("redis-server"):
        words = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()
        redis = next((w[2:] for w in words if w.startswith("v=")), "?")
    return (
        f"nproc={os.cpu_count()}, {model}, {memory:.0f} GiB; Python {platform.python_version()}; "
        f"{platform.system()} {platform.release()}; redis-server {redis}"
    )


def write_report(out: Path, name: str, report: dict[str, Any], text: str, logs: Path) -> None:
    """``name``.json and ``name``.md in ``out``, and the markdown printed."""
    (out / f"{name}.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    (out / f"{name}.md").write_text(text + "\n")
    print(text)
    print(f"\nwrote {out / f'{name}.json'}, {out / f'{name}.md'} and the processes' logs in {logs}")


def commit() -> str:
    git = ["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"]
    return subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip() or "?"


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """``rev`` checked out into a temporary git worktree of this repository, removed after."""
    with tempfile.TemporaryDirectory(prefix="bench-starts-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
            check=True,
            capture_output=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                check=False,
                capture_output=True,
            )

"""llama.cpp's own server with SmolLM2-135M-Instruct, in a subprocess of its own.

    .venv/bin/python -m probes.realmodel.server --port 8091            # serve until killed
    .venv/bin/python -m probes.realmodel.server --port 8091 --threads 2

The server is ``xllamacpp.Server``: llama.cpp's ``llama-server`` built into a wheel,
serving ``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``, ``/v1/models``
and ``/health`` from its own threads for as long as the object (and the process)
lives. Greedy with ``temperature: 0`` and without its prompt cache (``serve``), it
gives the same answer to the same request, whatever it was asked before: which is
what lets a test compare an answer through the gateway with the truth.

``LlamaServer`` runs it as a subprocess rather than in the caller's process: a test
of a server dying mid-answer needs one that a SIGKILL takes down whole, and the
caller (pytest, the probe) must outlive it. Its log goes to a file, never to a pipe
nobody reads (a full pipe would stall the server mid-answer).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx2

REPO = Path(__file__).resolve().parents[2]
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF = REPO / ".venv" / "models" / MODEL_FILE
INSTALL_HINT = (
    "run scripts/install: it installs xllamacpp (the dev extra) and puts the model at "
    f".venv/models/{MODEL_FILE}"
)
STARTUP_TIMEOUT = 60.0  # seconds: loading 97 MB and a warm-up decode take ~1 s
N_CTX = 4096  # shared by the slots: 2048 tokens each, far above any prompt + answer here
N_PARALLEL = 2  # two slots, so a second request (the truth, a retry) never queues


class RealModelMissing(RuntimeError):
    """The model file or the xllamacpp package is not installed."""


def gguf_path() -> Path:
    """The GGUF to serve: ``$REALMODEL_GGUF``, else the one ``scripts/install`` puts in
    ``.venv/models/``."""
    configured = os.environ.get("REALMODEL_GGUF")
    path = Path(configured) if configured else DEFAULT_GGUF
    if not path.is_file():
        origin = "REALMODEL_GGUF names" if configured else "the real-model tests need"
        raise RealModelMissing(f"{origin} {path}, which does not exist; {INSTALL_HINT}")
    return path


def check_installed() -> Path:
    """The GGUF's path, once both it and xllamacpp are known to be there."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise RealModelMissing(f"the xllamacpp package is not installed; {INSTALL_HINT}")
    return gguf_path()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LlamaServer:
    """One llama.cpp server subprocess on 127.0.0.1: ``with LlamaServer() as server:``
    starts it and waits until ``/health`` answers 200; ``server.url`` is its root
    (``http://127.0.0.1:PORT``; the OpenAI base URL is ``url + "/v1"``).

    ``kill()`` SIGKILLs it (a server dying mid-answer: its connections end, new ones
    are refused); ``restart()`` starts it again on the same port, so whatever points
    at it (a proxy, a gateway's config) needs no change."""

    def __init__(
        self,
        gguf: Path | None = None,
        *,
        port: int | None = None,
        threads: int = 1,
        batch_invariant: bool = True,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        self.gguf = gguf if gguf is not None else check_installed()
        self.port = port if port is not None else free_port()
        self.threads = threads
        self.batch_invariant = batch_invariant  # prompts processed a token at a time
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] = tempfile.NamedTemporaryFile(  # lives as long as self
            prefix=f"llama-{self.port}-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI SDK's base URL (the anthropic SDK takes ``url``)."""
        return self.url + "/v1"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> None:
        """Start the subprocess and wait until it serves."""
        if self.alive:
            raise RuntimeError(f"the llama server on port {self.port} is running already")
        command = [sys.executable, "-m", "probes.realmodel.server"]
        command += ["--port", str(self.port), "--gguf", str(self.gguf)]
        command += ["--threads", str(self.threads)]
        if not self.batch_invariant:
            command.append("--batched-prompts")
        self._log.write(f"--- {' '.join(command)}\n".encode())
        self._log.flush()
        # From the repository's root: probes is not an installed package.
        self.process = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log
        )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        with httpx2.Client(timeout=2) as client:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"the llama server exited ({self.process.returncode}) before it "
                        f"served; its log ({self.log_path}):\n{self.log_text()[-4000:]}"
                    )
                with contextlib.suppress(httpx2.HTTPError):
                    if client.get(self.url + "/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the llama server on port {self.port} was not healthy within "
                        f"{self.startup_timeout:.0f} s; its log ({self.log_path}):\n"
                        f"{self.log_text()[-4000:]}"
                    )
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its clients; the kernel ends its connections."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def restart(self) -> None:
        """Kill it if it runs, and start it again on the same port."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def close(self) -> None:
        self.stop()
        self._log.close()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LlamaServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def serve(gguf: Path, port: int, threads: int, *, batch_invariant: bool = True) -> None:
    """Serve ``gguf`` on 127.0.0.1:``port`` until the process is signalled."""
    import xllamacpp  # type: ignore[import-untyped]  # no stubs; imported only here

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = N_CTX
    params.n_parallel = N_PARALLEL
    # No prompt cache: with it, a request whose prompt begins with tokens a slot holds
    # reuses their KV, and KV computed token by token while generating is not bit-equal
    # to KV computed in one prompt batch, so an answer would depend on what the server
    # was asked before (measured: 4 prefill continuations in 39 differed). Without it, an
    # answer is a function of its request alone; each prompt costs ~0.3 s more.
    params.cache_prompt = False
    # Prompt processing one token at a time, as decoding is: a prompt batch computes the
    # same tokens' KV with other kernels, whose rounding tips a greedy choice at a near
    # tie, so a server continuing its own prefix (a prefill continuation) wrote something
    # else at 6 of 19 cuts of one answer with the default batch of 512, at 0 of 19 with
    # this (docs/recovery.md, "Exact on a real model"). Batch-invariant servers (this;
    # vLLM's and SGLang's deterministic modes) are what a byte-exact prefill needs.
    if batch_invariant:
        params.n_ubatch = 1
    # Decoding and prompt processing alike: one thread by default, so that two servers
    # and the gateway share two cores without one starving another.
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    server = xllamacpp.Server(params)  # serves from its own threads while it lives
    print(f"serving {gguf} on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # A parent that died without stopping it (pytest SIGKILLed, a probe interrupted)
    # leaves it to init: it stops then, rather than hold a port and 200 MB for good.
    parent = os.getppid()
    while not stop.wait(1) and os.getppid() == parent:
        pass
    del server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m probes.realmodel.server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gguf", type=Path, default=None, help="default: gguf_path()")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--batched-prompts",
        action="store_true",
        help="llama.cpp's default prompt batches (not batch-invariant: see serve())",
    )
    args = parser.parse_args(argv)
    gguf = args.gguf if args.gguf is not None else gguf_path()
    serve(gguf, args.port, args.threads, batch_invariant=not args.batched_prompts)


if __name__ == "__main__":
    main()

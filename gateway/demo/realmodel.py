"""The demo's first scene: a real model's answer, its server killed mid-sentence, finished
on another server through the gateway, byte-identical to the answer it gives unbroken.

SmolLM2-135M-Instruct (a 98 MB GGUF) on two llama.cpp servers (the ``xllamacpp`` wheel),
each a subprocess: A behind a proxy that forwards its answer up to the Nth event,
SIGKILLs it there and ends the connection; B, the fallback. The question is asked of A
directly first, greedy (temperature 0, a seed): that answer is the truth, and N is picked
in its middle, where a sentence goes on. Then the same question goes through a gateway
whose route sends it to A (two retries) and, once A is found dead, to B with the text the
client already has; the client, plain httpx2 as in the chaos scenes, must end with the
truth, byte for byte.

What it runs on is the real-model probe's harness (``probes.realmodel``: the servers, the
cutting proxy, the gateway's routes, the comparison): the same that measures recovery on a
real model (docs/recovery.md), here asked one question. It lives in the repository, not
in the installed package, and needs the ``demo`` extra (xllamacpp, the SDKs its client
uses) and the GGUF in ``.venv/models``: ``scripts/install --demo`` installs both. Where
any of it is missing, the scene is skipped, saying what to run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx2

from gateway.demo.checks import Outcome, rescue_between, tally
from gateway.demo.client import Received, stream_answer
from gateway.demo.report import Report, broke_line, received_line, rescued_line, seam_line
from gateway.demo.scenes import running_gateway
from gateway.metrics import Metrics

PROMPT = "Explain in two sentences why the sky is blue."
MAX_TOKENS = 120  # its answer (78 tokens) ends on its own, well before
INSTALL = "scripts/install --demo"
TITLE = (
    "A real model: SmolLM2-135M-Instruct on two llama.cpp servers. Server A is killed "
    "(SIGKILL) mid-sentence; the gateway finishes the answer on server B"
)
CHECK = "identical to the unbroken answer, byte for byte, with the same finish_reason"
# Where a sentence has ended: a cut there would not show one cut mid-sentence.
_SENTENCE_END = (".", "!", "?", ":", ";", "\n")


class Unavailable(Exception):
    """What the scene needs is not installed here: ``str()`` says what, ``fix`` how to
    install it (empty where no command would)."""

    def __init__(self, what: str, fix: str = INSTALL) -> None:
        super().__init__(what)
        self.fix = fix


def _checkout() -> Path | None:
    """The repository this package runs from (an editable install), if it is one."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "probes" / "realmodel" / "__init__.py").is_file() else None


def check_harness() -> Path:
    """Make ``probes.realmodel`` importable and check that what it runs is installed; the
    GGUF's path, or ``Unavailable`` saying what is missing."""
    root = _checkout()
    if root is None:
        raise Unavailable(
            "the real model runs from a clone of the repository (its probes/realmodel), "
            "not from the installed package alone",
            fix="",
        )
    # probes is the repository's, not an installed package (pyproject.toml installs
    # gateway*), and a console script's sys.path starts at the venv's bin, not the clone.
    if str(root) not in sys.path:
        sys.path.append(str(root))
    for package in ("openai", "anthropic", "xllamacpp"):
        if importlib.util.find_spec(package) is None:
            raise Unavailable(f"the {package} package is not installed")
    from probes.realmodel.server import RealModelMissing, check_installed

    try:
        return check_installed()
    except RealModelMissing:
        where = os.environ.get("REALMODEL_GGUF") or ".venv/models"
        raise Unavailable(f"SmolLM2-135M's GGUF is not in {where}") from None


def cut_point(deltas: tuple[str, ...]) -> int:
    """The event after which to cut an answer of ``deltas`` (one per SSE event): the
    first from its middle on whose text so far ends inside a sentence, after a word."""
    for events in range(len(deltas) // 2, len(deltas) - 2):
        text = "".join(deltas[:events])
        if text.rstrip() == text and not text.endswith(_SENTENCE_END):
            return events
    return len(deltas) // 2


def attempts(metrics: Metrics) -> dict[tuple[str, str], int]:
    """The gateway's upstream requests so far: (upstream, result) -> how many."""
    found: dict[tuple[str, str], int] = {}
    for family in metrics.attempts.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.value:
                key = (sample.labels["upstream"], sample.labels["result"])
                found[key] = found.get(key, 0) + round(sample.value)
    return found


def legs_line(requests: dict[tuple[str, str], int]) -> str:
    """The requests, by server (A's first, then B's) and result."""
    names = {"a": "server A", "b": "server B"}
    said = {"ok": "answered", "connect_error": "found nobody listening (connect_error)"}
    by_server: dict[str, list[str]] = {}
    for (upstream, result), count in requests.items():
        by_server.setdefault(upstream, []).append(f"{count} {said.get(result, result)}")
    return "; then ".join(
        f"{names.get(upstream, upstream)}: {', '.join(parts)}"
        for upstream, parts in by_server.items()
    )


def run_real_model(number: str, report: Report) -> Outcome:
    """The scene, reported under ``number``; skipped, saying why, if it cannot run here."""
    report.line()
    report.paragraph(f"{number}  {TITLE}", indent="     ", code="1")
    try:
        gguf = check_harness()
    except Unavailable as exc:
        report.field("skipped", f"{exc} ({exc.fix})" if exc.fix else str(exc))
        return Outcome(broke=False, passed=True, skipped=True, why=str(exc))
    try:
        return _play(gguf, report)
    except Exception as exc:  # a server that would not start, an SDK's error: told, not raised
        report.verdict(CHECK, [f"the scene failed: {type(exc).__name__}: {exc}"])
        return Outcome(broke=False, passed=False)


def _play(gguf: Path, report: Report) -> Outcome:
    from probes.realmodel.cases import MODEL, SEED, Answer, classify, unbroken
    from probes.realmodel.cut import CuttingProxy
    from probes.realmodel.routes import RETRY, gateway_config
    from probes.realmodel.server import LlamaServer

    report.field(
        "model",
        f"{MODEL}: {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) on llama.cpp's own "
        f"server (xllamacpp); greedy: temperature 0, seed {SEED}",
    )
    a, b = LlamaServer(gguf), LlamaServer(gguf)
    with contextlib.ExitStack() as stack:
        for server in (a, b):
            stack.callback(server.close)
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(LlamaServer.start, (a, b)))  # each loads the model in about a second
        proxy = stack.enter_context(CuttingProxy(a.port))
        metrics = Metrics()
        config = gateway_config(proxy.url, b.url, modes=("unset",), logging={"level": "error"})
        gateway_url = stack.enter_context(running_gateway(config, metrics))
        client = stack.enter_context(httpx2.Client(timeout=httpx2.Timeout(60.0)))
        report.field(
            "servers",
            f"A {a.url}, behind a proxy that will SIGKILL it mid-answer; B {b.url}, the "
            f"fallback  (both up in {time.perf_counter() - started:.1f} s)",
        )
        report.field(
            "gateway",
            f"{gateway_url}  (route {MODEL!r}: server A, {RETRY['retries']} retries, then B)",
        )
        report.field("prompt", f'"{PROMPT}"  (max_tokens {MAX_TOKENS})')

        started = time.perf_counter()
        truth = unbroken(a.url, "chat", PROMPT, MAX_TOKENS)  # the openai SDK, straight to A
        cut = cut_point(truth.deltas)
        prefix = truth.prefix(cut)
        report.field(
            "unbroken",
            f"asked of server A directly first: {len(truth.text)} characters in "
            f'{truth.events} events, finish_reason "{truth.finish}"  '
            f"({time.perf_counter() - started:.1f} s)",
        )

        # After the cut-th event A is SIGKILLed, and its connection ends (with a FIN, as a
        # killed server's kernel ends it); the gateway's retries find nobody listening.
        proxy.arm(cut, "close", on_cut=a.kill)
        request = {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "seed": SEED,
        }
        before = tally(metrics)
        started = time.perf_counter()
        report.start_live("client")
        try:
            show = _coloured_from(len(prefix), report)
            received = stream_answer(client, gateway_url, MODEL, show, request)
        finally:
            report.end_live()
        seconds = time.perf_counter() - started
        proxy.disarm()  # an answer shorter than the cut would leave it armed
        killed = proxy.cuts == 1 and not a.alive
        requests = attempts(metrics)
        rescue = rescue_between(before, tally(metrics), sum(requests.values()), [len(prefix)])

    if killed:
        report.field(
            "killed",
            f"server A, with SIGKILL, after {cut} of the answer's {truth.events} events "
            f"({len(prefix)} characters, mid-sentence)"
            + ("; its text above in cyan, server B's in yellow" if report.style.enabled else ""),
        )
    report.field("received", received_line(received, seconds))
    report.field("broke", broke_line(rescue, received))
    report.field("rescued", rescued_line(rescue, received))
    report.field("requests", legs_line(requests))
    if rescue.recoveries:
        report.field("seam", seam_line(received.text, len(prefix)))
    finish = received.finish_reasons[-1] if len(received.finish_reasons) == 1 else None
    exact = classify(truth, Answer(received.text, finish)) == "exact"
    problems = problems_of(truth.text, truth.finish, received, exact)
    if not killed:
        problems.append(f"server A was not killed (the answer had fewer than {cut} events)")
    if not any(upstream == "b" for upstream, _ in requests):
        problems.append("the answer was not finished on server B")
    report.verdict(CHECK, problems)
    return Outcome(broke=bool(rescue.interruptions), passed=not problems)


def _coloured_from(at: int, report: Report) -> Callable[[str], None]:
    """``report.live``, switching to yellow once ``at`` characters are shown: the text of
    server B's continuation (the gateway sent A's up to the cut, exactly)."""
    shown = 0

    def show(text: str) -> None:
        nonlocal shown
        if shown < at <= shown + len(text):
            report.live(text[: at - shown])
            report.live_colour("33")
            text = text[at - shown :]
            shown = at
        report.live(text)
        shown += len(text)

    return show


def problems_of(text: str, finish: str | None, received: Received, exact: bool) -> list[str]:
    """How what the client received differs from the unbroken answer (``text``, ended with
    ``finish``); ``exact``: the real-model probe's comparison found none."""
    problems = []
    if received.error is not None:
        problems.append(f"the stream ended with an error: {received.error.get('message')}")
    if received.text != text:
        agree = len(os.path.commonprefix([received.text, text]))
        problems.append(
            f"the text differs from character {agree} on ({len(received.text)} characters "
            f"received, {len(text)} in the unbroken answer)"
        )
    if received.finish_reasons != [finish]:
        problems.append(f"finish_reason {received.finish_reasons}, not [{finish!r}]")
    if not received.done:
        problems.append("no [DONE]")
    if not exact and not problems:
        problems.append("the real-model probe's comparison says it is not the unbroken answer")
    return problems

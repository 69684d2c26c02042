"""The benchmark harness end to end: ``python -m bench --quick``, as CI runs it.

A smoke test, no timing assertions: every target (direct, the gateway four
ways, LiteLLM's proxy) answers every workload without an error, the Responses,
Messages and Gemini API rows (direct and the gateway) too, durability sync is
reported next to async, and the results are written as JSON, markdown and a PNG
chart; ``--only gemini`` runs that row alone. The benchmark client's Messages and
Gemini readers are checked on their own against known chaos answers.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import workloads
from bench.client import Connection, Result
from bench.workloads import GEMINI, HEADERS, MESSAGES, PATHS, body, continuation
from gateway.chaos import ChaosUpstream, expected_answer, running_chaos_upstream

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ["direct", "off", "memory", "redis", "redis-async", "baseline", "litellm"]


def bench_module(module: str, *args: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root; it must exit 0."""
    run = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


@pytest.mark.timeout(900)  # installs LiteLLM into bench/.venv-litellm the first time
def test_quick_benchmark_runs_every_workload_against_every_target(tmp_path: Path) -> None:
    # --against HEAD: the default gateway once more, from a worktree, side by side.
    run = bench_module("bench", "--quick", "--against", "HEAD", "--out", str(tmp_path), timeout=880)
    results = orjson.loads((tmp_path / "results.json").read_bytes())
    assert results["configs"] == CONFIGS
    assert results["meta"]["quick"] is True

    for name in CONFIGS:
        ttft = results["ttft"][name]
        assert ttft["n"] > 0 and ttft["errors"] == 0, (name, ttft)
        for level in results["concurrency"][name].values():
            assert level["errors"] == 0, (name, level)
            assert level["frames_per_s"] > 0
        assert results["nonstream"][name]["errors"] == 0, (name, results["nonstream"][name])
    for name in ("off", "memory", "redis", "redis-async"):
        seam = results["seam"][name]
        assert seam["n"] > 0 and seam["errors"] == 0, (name, seam)
        assert results["resources"][name]["rss_idle_mb"] > 0
    # Redis commands are counted per round: the Redis targets make them (a few may land
    # in the next target's round: a run's last checkpoint is written as it ends).
    for n, level in results["concurrency"]["memory"].items():
        for name in ("redis", "redis-async"):
            theirs = results["concurrency"][name][n]
            assert theirs["lateness_p50"] is not None
            assert theirs["redis_ops_per_s"] > 10 * level["redis_ops_per_s"], (name, n)

    # The Responses row: direct and the gateways, chat and Responses rounds side by side.
    responses = results["responses"]
    for name in ("direct", "off", "memory", "redis"):
        ttft = responses["ttft"][name]
        assert ttft["n"] > 0 and ttft["errors"] == 0, (name, ttft)
        for protocol in ("chat", "responses"):
            row = responses["concurrency"][protocol][name]
            assert row["errors"] == 0 and row["frames_per_s"] > 0, (name, protocol, row)
            assert row["total_streams"] == responses["streams"], (name, protocol, row)
    for name in ("off", "memory", "redis"):
        seam = responses["seam"][name]
        assert seam["n"] > 0 and seam["errors"] == 0, (name, seam)
        assert set(responses["summary"][name]) >= {"cpu_ratio", "ttft_added_p50"}
    assert "litellm" not in responses["ttft"]

    # The Messages and Gemini rows: the same, against the chaos upstream (chat's too).
    check_chaos_row(results, "messages")
    check_chaos_row(results, "gemini")

    markdown = (tmp_path / "results.md").read_text()
    assert results["labels"]["baseline"].startswith("gateway at HEAD")
    assert "- Against HEAD (same config, same run): added TTFT p50" in markdown
    assert "### Responses API, side by side with chat" in markdown
    assert "### Anthropic Messages API, side by side with chat" in markdown
    assert "| Messages CPU per delta vs chat's, 8 streams | ≤ 1.15× |" in markdown
    assert "### Gemini API, side by side with chat" in markdown
    assert "| Gemini CPU per delta vs chat's, 8 streams | ≤ 1.15× |" in markdown
    assert "### Durability: sync (group commit) vs async, Redis checkpoints" in markdown
    assert "| Responses CPU per delta vs chat's, 8 streams | ≤ 1.25× |" in markdown
    assert "smoke" in markdown.lower()
    assert "LiteLLM proxy" in markdown and "| Added TTFT p50, one stream |" in markdown
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert run.stdout.startswith("## Results")


def check_chaos_row(results: dict[str, Any], key: str) -> None:
    """A protocol row measured against the chaos upstream (``key``: messages, gemini):
    TTFT (its own and chat's), rounds side by side, seam and summary, LiteLLM left out."""
    section = results[key]
    for name in ("direct", "off", "memory", "redis"):
        for which in ("ttft", "chat_ttft"):
            ttft = section[which][name]
            assert ttft["n"] > 0 and ttft["errors"] == 0 and ttft["p50"] > 0, (key, name, ttft)
        for protocol in ("chat", key):
            row = section["concurrency"][protocol][name]
            assert row["errors"] == 0 and row["frames_per_s"] > 0, (key, name, protocol, row)
            assert row["total_streams"] == section["streams"], (key, name, protocol, row)
    for name in ("off", "memory", "redis"):
        seam = section["seam"][name]
        assert seam["n"] > 0 and seam["errors"] == 0, (key, name, seam)
        assert seam["p50"] > 0 and seam["leg_ttft_p50"] > 0, (key, name, seam)
        summary = section["summary"][name]
        assert summary[f"{key}_cpu_ms_per_delta"] > 0, (key, name, summary)
        assert summary["cpu_ratio"] > 0, (key, name, summary)
        assert summary["ttft_added_p50"] is not None, (key, name, summary)
    assert "litellm" not in section["ttft"]


@pytest.mark.timeout(300)
def test_quick_benchmark_runs_only_the_gemini_row_when_asked(tmp_path: Path) -> None:
    # --only gemini: the Gemini row and the chat seam its summary quotes, no LiteLLM.
    bench_module("bench", "--quick", "--only", "gemini", "--out", str(tmp_path))
    results = orjson.loads((tmp_path / "results.json").read_bytes())
    assert results["configs"] == ["direct", "off", "memory", "redis", "redis-async"]
    assert results["meta"]["plan"]["rows"] == ["gemini"]
    assert not {"ttft", "concurrency", "responses", "messages"} & set(results)
    check_chaos_row(results, "gemini")
    assert results["gemini"]["summary"]["memory"]["chat_seam_excess_p50"] is not None
    names = [row["name"] for row in results["targets"]]
    assert names and all(name.startswith("Gemini ") for name in names), names
    markdown = (tmp_path / "results.md").read_text()
    assert "### Gemini API, side by side with chat" in markdown


@pytest.fixture(scope="module")
def chaos() -> Iterator[ChaosUpstream]:
    with running_chaos_upstream() as upstream:
        yield upstream


def messages_request(upstream: ChaosUpstream, payload: bytes, stream: bool = True) -> Result:
    return chaos_request(upstream, MESSAGES, payload, stream)


def chaos_request(
    upstream: ChaosUpstream,
    protocol: str,
    payload: bytes,
    stream: bool = True,
    model: str | None = None,
) -> Result:
    async def request() -> Result:
        headers = HEADERS.get(protocol, {})
        connection = Connection("127.0.0.1", upstream.port, PATHS[protocol], headers)
        try:
            return await connection.request(payload, stream=stream, model=model)
        finally:
            await connection.close()

    return asyncio.run(request())


def test_the_messages_reader_counts_the_text_deltas_of_a_chaos_answer(
    chaos: ChaosUpstream,
) -> None:
    # Thinking, signature, tool_use and input_json deltas are not text: 12 deltas only.
    spec = "chaos:text=12,reasoning=3,tools=1,seed=7"
    result = messages_request(chaos, body(spec, True, MESSAGES))
    assert result.error is None and result.done, result
    assert len(result.times) == 12
    assert result.ttft is not None and result.ttft > 0
    assert result.times == sorted(result.times)

    whole = messages_request(chaos, body(spec, False, MESSAGES), stream=False)
    assert whole.error is None and whole.done and len(whole.times) == 1

    # An overloaded_error event after 5 text deltas: an error, and no message_stop.
    broken = messages_request(chaos, body("chaos:text=12,fault=error,at=5", True, MESSAGES))
    assert not broken.done and len(broken.times) == 5
    assert broken.error is not None and "overloaded_error" in broken.error


def test_the_messages_seam_baseline_is_a_prefill_the_chaos_upstream_continues(
    chaos: ChaosUpstream,
) -> None:
    spec = "chaos:text=40,seed=3"
    result = messages_request(chaos, continuation(spec, MESSAGES))
    assert result.error is None and result.done and result.times, result
    (recorded,) = chaos.requests_for(spec)
    text = expected_answer(spec).text
    assert recorded.prefix and text.startswith(recorded.prefix)
    assert recorded.answered_text == text[len(recorded.prefix) :]


@pytest.mark.timeout(300)
def test_quick_engines_benchmark_streams_every_frame_through_every_engine(
    tmp_path: Path,
) -> None:
    # bench.engines: the gateway twice, identical but for the upstream's engine.
    streams, chunks, requests = (1, 4), 8, 10
    run = bench_module(
        "bench.engines",
        *("--quick", "--out", str(tmp_path), "--streams", ",".join(map(str, streams))),
        *("--chunks", str(chunks), "--ttft-requests", str(requests)),
    )
    results = orjson.loads((tmp_path / "results.json").read_bytes())
    assert results["configs"] == ["direct", "builtin", "httpx"]
    assert results["meta"]["quick"] is True and results["meta"]["plan"]["rounds"] == 1
    for name in results["configs"]:
        ttft = results["ttft"][name]
        assert ttft["n"] == requests and ttft["errors"] == 0, (name, ttft)
        for n in streams:
            row = results["concurrency"][name][str(n)]
            assert row["errors"] == 0 and row["stalled"] is not None, (name, n, row)
            assert row["total_streams"] == n and row["deltas"] == n * chunks, (name, n, row)
            assert row["frames_per_s"] > 0, (name, n, row)
    for engine in ("builtin", "httpx"):
        assert results["ttft"][engine]["cpu_ms_per_request"] > 0, engine
        assert results["summary"]["ttft"][engine]["cpu_ratio"] > 0, engine
        for n in streams:
            row = results["summary"][str(n)][engine]
            assert row["cpu_ms_per_delta"] > 0 and row["cpu_ratio"] > 0, (engine, n, row)
            assert row["proxy_cpu_pct"] > 0 and row["frames_vs_direct"] > 0, (engine, n, row)
    assert results["summary"]["4"]["builtin"]["cpu_ratio"] == 1.0
    markdown = (tmp_path / "results.md").read_text()
    assert markdown.startswith("## Upstream HTTP engines") and "smoke" in markdown.lower()
    assert "| 4 | httpx |" in markdown
    assert run.stdout.startswith("## Upstream HTTP engines")


def test_request_start_benchmark_compares_two_trees_and_profiles_both() -> None:
    # bench.starts against HEAD: the same code twice, from this tree and a worktree.
    run = bench_module(
        "bench.starts",
        *("--against", "HEAD", "--streams", "16", "--rounds", "2", "--profile", "--top", "40"),
    )
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| this", "| at HEAD"))]
    assert len(rows) == 2, run.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == "32" and cells[-1] == "0", row  # 32 requests, no errors
        assert float(cells[2]) >= 0, row  # CPU µs per request (10 ms ticks: may read 0)
    assert "CPU per request start:" in run.stdout
    profiles = run.stdout.split("Profile, ")[1:]
    assert [p.split(" ", 1)[0] for p in profiles] == ["this", "at"]
    for profile in profiles:
        assert "(chat_completions)" in profile and "(_produce)" in profile, profile


def test_floor_benchmark_runs_the_pipe_the_bare_stack_and_the_gateway() -> None:
    run = bench_module("bench.floor", "--streams", "8", "--rounds", "1")
    rows = {}
    for line in run.stdout.splitlines():
        if line.startswith("| ") and not line.startswith(("| target", "| :--")):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[cells[0]] = cells
    assert list(rows) == ["direct", "pipe", "asgi", "gateway"], run.stdout
    for name, cells in rows.items():
        assert cells[4] == "0", cells  # errors: every stream got its 64 deltas and [DONE]
        assert cells[3].endswith("of 8"), cells
        assert float(cells[2]) > 0.5, cells  # frames/s against direct's
        if name != "direct":
            assert float(cells[1]) >= 0, cells  # CPU µs per delta (10 ms ticks: may read 0)
    assert "The gateway's own work:" in run.stdout


def test_the_harness_pauses_its_collector_only_while_it_measures() -> None:
    assert gc.isenabled()
    with workloads.collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:  # a caller that had it off keeps it off
        with workloads.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_replication_benchmark_waits_for_the_replica_and_loses_no_frame() -> None:
    run = bench_module("bench.replication", "--streams", "8", "--rounds", "1")
    rows = [line for line in run.stdout.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 2, run.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[-1] == "0" and cells[-2].endswith("of 8"), row  # every stream, no error
        assert float(cells[3]) > 0.5, row  # frames/s against the primary-only gateway
    written = run.stdout.split("checkpoint writes: ")[1]
    acknowledged = int(written.split(" ")[0])
    assert acknowledged > 0 and ", 0 not in time" in written, run.stdout


def test_tracing_benchmark_compares_off_sampled_and_all_and_exports_spans() -> None:
    run = bench_module("bench.tracing", "--streams", "8", "--rounds", "1")
    rows = [line for line in run.stdout.splitlines() if line.startswith("| 8 |")]
    assert [row.split("|")[2].strip() for row in rows] == [
        "off (default)",
        "on, 10% sampled",
        "on, 100% (default)",
    ], run.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[-1] == "0" and cells[-2].endswith("of 8"), row  # every stream, no error
        assert float(cells[3]) > 0.5, row  # frames/s against the untraced gateway
    received = run.stdout.split("Spans the sink received: ")[1]
    counts = dict(part.split(" ") for part in received.rstrip(".\n").split(", "))
    assert counts["off"] == "0", run.stdout  # off: nothing exported
    # 100%: a run span and an upstream request span for every stream of every round.
    assert int(counts["all"]) >= 2 * 8, run.stdout


def test_the_websocket_benchmark_times_every_way() -> None:
    """bench.websocket: turns over one socket, over HTTP through the gateway, direct."""
    run = bench_module("bench.websocket", "--rounds", "1", "--turns", "3", timeout=120)
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [
        "direct (HTTP)",
        "gateway, HTTP",
        "gateway, WebSocket",
    ]
    for row in rows:
        ttft, _, turn = (float(cell) for cell in row.split(" | ")[1:4])
        assert 0 < ttft <= turn, row
    assert "WebSocket ÷ HTTP through the gateway" in run.stdout


THOUGHTS = {"generationConfig": {"thinkingConfig": {"includeThoughts": True}}}


def test_the_gemini_reader_counts_the_text_parts_of_a_chaos_answer(chaos: ChaosUpstream) -> None:
    # Thought parts and the functionCall part are not text: 12 deltas only (the seeds
    # are not the Messages tests': the module's chaos upstream records them all).
    spec = "chaos:text=12,reasoning=3,tools=1,seed=8"
    result = chaos_request(chaos, GEMINI, body(spec, True, GEMINI, **THOUGHTS), model=spec)
    assert result.error is None and result.done, result
    assert len(result.times) == 12
    assert result.times == sorted(result.times)
    (recorded,) = chaos.requests_for(spec)
    assert recorded.path.startswith(f"/v1beta/models/{spec}:streamGenerateContent")

    # Google's raw error object after 5 text chunks: an error, and no finishReason.
    spec = "chaos:text=12,fault=error,at=5"
    broken = chaos_request(chaos, GEMINI, body(spec, True, GEMINI), model=spec)
    assert not broken.done and len(broken.times) == 5
    assert broken.error is not None and "UNAVAILABLE" in broken.error

    # The same as a data: event.
    spec = "chaos:text=12,fault=error_data,at=5"
    broken = chaos_request(chaos, GEMINI, body(spec, True, GEMINI), model=spec)
    assert not broken.done and broken.error is not None and "UNAVAILABLE" in broken.error


def test_the_gemini_seam_baseline_is_a_prefill_the_chaos_upstream_continues(
    chaos: ChaosUpstream,
) -> None:
    spec = "chaos:text=40,seed=4"
    result = chaos_request(chaos, GEMINI, continuation(spec, GEMINI), model=spec)
    assert result.error is None and result.done and result.times, result
    (recorded,) = chaos.requests_for(spec)
    text = expected_answer(spec).text
    assert recorded.prefix and text.startswith(recorded.prefix)
    assert recorded.answered_text == text[len(recorded.prefix) :]

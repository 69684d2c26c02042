"""The benchmark harness end to end: ``python -m bench --quick``, as CI runs it.

A smoke test, no timing assertions: every target (direct, the gateway four
ways, LiteLLM's proxy) answers every workload without an error, the Responses
API row (direct and the gateway) too, durability sync is reported next to async,
and the results are written as JSON, markdown and a PNG chart.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ["direct", "off", "memory", "redis", "redis-async", "litellm"]


@pytest.mark.timeout(900)  # installs LiteLLM into bench/.venv-litellm the first time
def test_quick_benchmark_runs_every_workload_against_every_target(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
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

    markdown = (tmp_path / "results.md").read_text()
    assert "### Responses API, side by side with chat" in markdown
    assert "### Durability: sync (group commit) vs async, Redis checkpoints" in markdown
    assert "| Responses CPU per delta vs chat's, 8 streams | ≤ 1.25× |" in markdown
    assert "smoke" in markdown.lower()
    assert "LiteLLM proxy" in markdown and "| Added TTFT p50, one stream |" in markdown
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert run.stdout.startswith("## Results")

"""The chaos soak (``python -m probes.soak``): its verdicts, and a short run end to end.

The verdict tests feed ``probes.soak.check.classify`` hand-made client views of
one spec's answer (from ``expected_answer``, as the soak does), so each outcome
and defect is pinned without a process. The end-to-end test runs the real soak,
as CI would: 60 streams through two gateway replicas sharing a redis-server,
with Redis and one replica SIGKILLed mid-way, and asserts that every stream was
exact (or ended with a counted error) and none was lost, duplicated, silently
wrong, without its usage chunk or with broken tool JSON.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.chaos import expected_answer, parse_spec
from probes.soak.check import (
    DEFECTS,
    STREAM_FAULTS,
    Received,
    classify,
    is_subsequence,
    random_spec,
)

ROOT = Path(__file__).resolve().parent.parent
TEXT = "chaos:text=30,seed=7,usage=1"
TOOLS = "chaos:text=12,tools=3,reasoning=5,seed=9,usage=1"


def whole(spec: str) -> Received:
    """What a client of an uninterrupted answer assembles."""
    answer = expected_answer(spec)
    received = Received(
        text=answer.text,
        reasoning=answer.reasoning,
        roles=["assistant"],
        finish_reasons=[answer.finish_reason],
        ids={"chatcmpl-1"},
        usage=[{"prompt_tokens": 11, "completion_tokens": 30, "total_tokens": 41}],
    )
    for index, call in enumerate(answer.tool_calls):
        received.tool_calls[index] = {"id": call.id, "name": call.name, "args": call.arguments}
    return received


def test_random_specs_parse_and_differ() -> None:
    rng = random.Random(5)
    specs = [random_spec(rng, seed) for seed in range(1, 400)]
    assert len(set(specs)) == len(specs)  # times= counts per spec string
    parsed = [parse_spec(spec) for spec in specs]
    assert all(5 <= s.text <= 120 and s.usage for s in parsed)
    assert {s.fault for s in parsed} >= set(STREAM_FAULTS)
    assert "error_fatal" not in STREAM_FAULTS and len(STREAM_FAULTS) == 8
    assert {s.times for s in parsed if s.fault} == {1, 2}
    assert any(s.tools for s in parsed) and any(s.reasoning for s in parsed)
    assert any(s.split for s in parsed)
    assert all(s.stall_s <= 2.5 for s in parsed if s.fault == "stall")


def test_subsequence() -> None:
    assert is_subsequence("ace", "abcde")
    assert not is_subsequence("aec", "abcde")
    assert is_subsequence("", "x")


@pytest.mark.parametrize("spec", [TEXT, TOOLS])
def test_the_whole_answer_is_exact(spec: str) -> None:
    assert classify(spec, whole(spec), None, False).outcome == "exact"


def test_a_stream_that_ended_with_an_error_is_counted_apart_not_exact() -> None:
    received = whole(TEXT)
    received.text = received.text[:40]
    received.finish_reasons, received.usage = [], []
    verdict = classify(TEXT, received, "error event: upstream_interrupted", False)
    assert (verdict.outcome, verdict.defects) == ("error", [])


def test_lost_and_duplicated_text() -> None:
    text = expected_answer(TEXT).text
    lost = whole(TEXT)
    lost.text = text[:20] + text[25:]
    assert classify(TEXT, lost, None, False).defects == ["lost", "silently_wrong"]
    doubled = whole(TEXT)
    doubled.text = text[:20] + text[15:]
    assert classify(TEXT, doubled, None, False).defects == ["duplicated", "silently_wrong"]
    # Ended with an error: a clean beginning is fine, a hole in it is not.
    holed = whole(TEXT)
    holed.text, holed.finish_reasons = text[:10] + text[12:30], []
    assert classify(TEXT, holed, "error", False).defects == ["lost"]


def test_a_truncated_answer_that_ends_quietly_is_lost() -> None:
    received = whole(TEXT)
    received.text = received.text[:-5]
    received.finish_reasons = []
    verdict = classify(TEXT, received, None, False)
    assert verdict.outcome == "defective"
    assert verdict.defects == ["lost", "contract"]


def test_usage_chunks_must_be_exactly_one() -> None:
    for usage in ([], [{"total_tokens": 1}, {"total_tokens": 2}]):
        received = whole(TEXT)
        received.usage = list(usage)
        assert classify(TEXT, received, None, False).defects == ["missing_usage"]


def test_tool_calls_cut_after_a_complete_call_is_the_synthesize_plan() -> None:
    received = whole(TOOLS)
    del received.tool_calls[2]
    assert classify(TOOLS, received, None, False).outcome == "tools_cut"
    del received.tool_calls[1], received.tool_calls[0]
    verdict = classify(TOOLS, received, None, False)
    assert verdict.defects == ["silently_wrong"]


def test_broken_tool_json() -> None:
    received = whole(TOOLS)
    received.tool_calls[1]["args"] = received.tool_calls[1]["args"][:-1]
    verdict = classify(TOOLS, received, None, False)
    assert verdict.defects == ["broken_tool_json", "silently_wrong"]
    received = whole(TOOLS)
    received.tool_calls[0]["args"] = '{"city": "elsewhere"}'
    assert "broken_tool_json" in classify(TOOLS, received, None, False).defects


def test_contract_breaks_and_timeouts() -> None:
    received = whole(TEXT)
    received.finish_reasons *= 2
    assert classify(TEXT, received, None, False).defects == ["contract"]
    received = whole(TOOLS)
    received.reasoning += "again"
    assert classify(TOOLS, received, None, False).defects == ["contract"]
    received = whole(TEXT)
    received.text = received.text[:10]
    received.finish_reasons = []
    verdict = classify(TEXT, received, None, True)
    assert (verdict.outcome, verdict.defects) == ("timed_out", ["timed_out"])


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
@pytest.mark.timeout(300)
def test_short_soak_with_redis_and_a_replica_killed_has_only_exact_answers(
    tmp_path: Path,
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "probes.soak", "--streams", "60", "--concurrency", "8"]
        + ["--redis-kill-at", "0.25", "--replica-kill-at", "0.55", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    report: dict[str, Any] = orjson.loads((tmp_path / "soak.json").read_bytes())
    counts = report["counts"]
    summary = run.stdout[-6000:] + run.stderr[-3000:]
    events = [event["event"] for event in report["infrastructure"]]
    assert events == [
        "redis-server SIGKILLed",
        "redis-server restarted",
        "replica A SIGKILLed",
        "gateway-A restarted",
    ], summary
    assert not report["infrastructure_failed"], summary
    # The kill took streams with it: they resumed on the other replica. (With Redis,
    # serve starts a worker per CPU, and a SIGKILLed parent leaves its workers serving:
    # the soak starts its replicas with --workers 1, or nothing would have broken.)
    assert report["resumes"]["after_kill"] > 0, summary
    assert sum(counts[k] for k in ("exact", "tools_cut", "error")) == 60, summary
    for defect in (*DEFECTS, "not_run"):
        assert counts[defect] == 0, (defect, summary)
    # Every fault is within the retry budget (times <= 2, three attempts per leg), so
    # an error end is a defect here too, and tool calls cut short are the exception.
    assert counts["error"] == 0, summary
    assert counts["exact"] >= 50, summary
    assert run.returncode == 0, summary
    assert run.stdout.startswith("## Soak: 60 streams")

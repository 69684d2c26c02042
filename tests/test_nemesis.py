"""The nemesis (``python -m probes.nemesis``): its proxy's rewrite, and the short profile
end to end.

The end-to-end test runs the real probe as a user would: three gateway replicas on a
Sentinel-replicated Redis (a primary, a replica, three sentinels), 12 concurrent
streams that drop and resume on random replicas, and a seeded nemesis that pauses
the Redis primary past the sentinels' down-after (twice), kills a gateway replica
and cuts one off from Redis. It asserts that no stream was silently wrong
and none hung (explicit errors are counted, not failed: fewer of them is issue 40's
item 2, measured in BENCHMARKS.md, "Under a nemesis").
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from probes.nemesis.__main__ import category, error_code, parse_args
from probes.nemesis.proxy import Rewriter, patterns

ROOT = Path(__file__).resolve().parent.parent


def test_rewriter_rewrites_ports_cut_anywhere() -> None:
    rewrites = patterns({34567: 41234, 50000: 50001})
    reply = (
        b"*2\r\n$9\r\n127.0.0.1\r\n$5\r\n34567\r\n"  # get-master-addr-by-name
        b"*1\r\n*3\r\n:0\r\n:5460\r\n*2\r\n$9\r\n127.0.0.1\r\n:50000\r\n"  # CLUSTER SLOTS
        b"-MOVED 3999 127.0.0.1:34567\r\n"
        b"$5\r\n34568\r\n:34567000\r\n"  # not ports: left alone
    )
    expected = (
        reply.replace(b"$5\r\n34567\r\n", b"$5\r\n41234\r\n")
        .replace(b":50000\r\n", b":50001\r\n")
        .replace(b"127.0.0.1:34567", b"127.0.0.1:41234")
    )
    for size in (1, 2, 3, 7, 64):
        rewriter = Rewriter(rewrites)
        out = b"".join(rewriter.feed(reply[i : i + size]) for i in range(0, len(reply), size))
        assert out + rewriter.flush() == expected
        assert rewriter.tail == b""
    whole = Rewriter(rewrites)
    assert whole.feed(b"+OK\r\n") == b"+OK\r\n"  # a whole reply is never held back
    assert whole.feed(b":34567\r\n") == b":41234\r\n"


def test_verdicts_and_profiles() -> None:
    assert error_code("HTTP 404 run_not_found") == "404 run_not_found"
    assert error_code("error event: resume_not_exact Run 'x' …") == "in-band resume_not_exact"
    assert category("defective", ["lost", "silently_wrong"]) == "silent"
    assert category("timed_out", ["timed_out"]) == "hung"
    assert category("defective", ["lost"]) == "damaged"
    assert category("error", []) == "error"
    short = parse_args(["--profile", "short"])
    assert short.topology == "sentinel" and short.duration <= 60
    assert "primary_pause" in short.actions and short.pause_s[0] > 1.0  # past down-after
    long = parse_args(["--topology", "cluster", "--seed", "3"])
    assert long.duration == 240 and len(long.actions) == 6 and long.order == "random"


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_short_profile_is_never_silently_wrong_nor_hung(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "probes.nemesis", "--profile", "short", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    report_path = tmp_path / "nemesis.json"
    assert report_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = orjson.loads(report_path.read_bytes())
    counts = report["counts"]
    assert not report["infrastructure_failed"], report["nemesis"]
    assert counts["streams"] >= 50, counts
    assert counts["exact"] + counts["tools_cut"] >= counts["streams"] // 2, counts
    events = [e["event"] for e in report["nemesis"]]
    assert any("SIGSTOPped" in e and "primary" in e for e in events), events
    assert any("cut off from Redis" in e for e in events), events
    wrong = [s for s in report["streams"] if s["outcome"] in ("silent", "hung")]
    assert counts["silent"] == 0 and counts["hung"] == 0, (counts, wrong[:3])
    assert done.returncode in (0, 1), done.stderr[-3000:]

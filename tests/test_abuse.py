"""Abuse: the SSE decoder and the path validator under random input, and the abuse suite.

The property tests are pure (no sockets): ``SSEDecoder`` fed random bytes in random
reads never raises anything but its own ``EventTooLarge`` and never keeps more
than its limit between reads (ARCHITECTURE.md 6a: one SSE line/event is bounded);
``relay_target`` given random request paths either refuses them (``UnsafePath``)
or yields a target that stays on the configured upstream (6a: nothing from the
request can change the authority).

The end-to-end test runs ``python -m probes.abuse --quick`` as CI would: real
gateway processes, the chaos upstream, a raw upstream and a victim listener, and
asserts that every probe met its expectation (read from its JSON report).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.sse import EventTooLarge, SSEDecoder
from gateway.upstream.target import UnsafePath, relay_target, upstream_url

ROOT = Path(__file__).resolve().parent.parent

# -- the SSE decoder ----------------------------------------------------------------------

_LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
_FIELDS = st.sampled_from([b"data: ", b"data:", b"data", b": ", b":", b"event: ", b"id: ", b""])
_VALUES = st.one_of(
    st.sampled_from([b"", b"{}", b"[DONE]", b'{"a": 1}', b"x" * 40, b"\xff\xc3", b" lead"]),
    st.binary(max_size=24).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b"")),
)
_LINES = st.tuples(_FIELDS, _VALUES, _LINE_ENDS).map(b"".join)
_EVENTS = st.tuples(st.lists(_LINES, min_size=1, max_size=3).map(b"".join), _LINE_ENDS).map(
    b"".join
)
SSE_BODIES = st.one_of(
    st.binary(max_size=2048),  # anything at all
    st.tuples(  # event streams: field lines, blank lines, every line end, a BOM
        st.sampled_from([b"", b"\xef\xbb\xbf"]),
        st.lists(st.one_of(_EVENTS, _LINES, _LINE_ENDS), max_size=40).map(b"".join),
        st.binary(max_size=8),  # a last line cut off
    ).map(b"".join),
)


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    """``body`` cut at ``cuts`` (mod its length) into non-empty reads."""
    points = sorted({c % (len(body) + 1) for c in cuts})
    edges = zip([0, *points], [*points, len(body)], strict=True)
    return [body[a:b] for a, b in edges if b > a]


def buffered(decoder: SSEDecoder) -> int:
    """What the decoder really keeps between reads, counted from its buffers rather than
    taken from its own ``held``, so a bookkeeping slip cannot hide a leak."""
    return sum(map(len, decoder._partial)) + sum(map(len, decoder._data))


def decode(reads: list[bytes], limit: int) -> list[bytes]:
    decoder = SSEDecoder(limit)
    return [payload for read in reads for payload in decoder.feed(read)]


@settings(max_examples=300, deadline=None)
@given(
    body=SSE_BODIES,
    cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=40),
    limit=st.integers(min_value=1, max_value=600),
)
def test_sse_decoder_raises_only_event_too_large_and_holds_at_most_its_limit(
    body: bytes, cuts: list[int], limit: int
) -> None:
    decoder = SSEDecoder(limit)
    for read in split_at(body, cuts):
        try:
            payloads = decoder.feed(read)
        except EventTooLarge:
            # The stream is broken (the run recovers it): nothing of it is kept.
            assert decoder.held == 0 and buffered(decoder) == 0
            return
        assert all(isinstance(p, bytes) and p for p in payloads)
        assert decoder.held <= limit
        assert buffered(decoder) == decoder.held


@settings(max_examples=200, deadline=None)
@given(body=SSE_BODIES, cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=40))
def test_sse_decoder_output_does_not_depend_on_how_the_body_is_read(
    body: bytes, cuts: list[int]
) -> None:
    limit = 1 << 20  # far above any body here: no EventTooLarge
    assert decode(split_at(body, cuts), limit) == decode([body], limit)


@settings(max_examples=100, deadline=None)
@given(size=st.integers(min_value=1, max_value=200_000), read=st.integers(1, 70_000))
def test_a_line_without_an_end_is_refused_within_the_limit_plus_one_read(
    size: int, read: int
) -> None:
    limit = 50_000
    decoder = SSEDecoder(limit)
    body = b"data: " + b"x" * size
    refused_at = None  # bytes fed when it was refused
    for start in range(0, len(body), read):
        try:
            decoder.feed(body[start : start + read])
        except EventTooLarge:
            refused_at = min(start + read, len(body))
            break
        assert decoder.held <= limit
    if len(body) > limit:
        assert refused_at is not None and refused_at <= limit + read
    else:
        assert refused_at is None and decoder.held == len(body)


def test_an_empty_read_between_cr_and_lf_changes_nothing() -> None:
    # An empty read used to clear the pending CR, so its LF read as a blank line.
    assert decode([b"data: a\r", b"", b"\ndata: b\n\n"], 1024) == [b"a\nb"]


# -- the path validator -------------------------------------------------------------------

ROOTS = [
    httpx2.URL("http://127.0.0.1:9000/v1"),
    httpx2.URL("http://127.0.0.1:9000"),
    httpx2.URL("https://api.example.com/openai/v1/"),
]
PATH_PIECES = st.sampled_from(
    [b"/", b"//", b"%2f", b"%2F", b"%5c", b"%5C", b"\\", b".", b"..", b"%2e", b"%2E"]
    + [b"%252e", b"%252f", b"@", b"%40", b":", b"http:", b"127.0.0.1:1", b"evil.example"]
    + [b"%00", b"%0d%0a", b"\r\n", b"%ff", b"\xff", b"\xc3\xa9", b"%c3%a9", b"?", b"#"]
    + [b"%", b"%%", b"%g0", b" ", b"%20", b"~", b"x", b"models", b"v1", b";", b"="]
)
# Pieces of one segment that a real API path might hold (so many paths pass), and a few
# that must not pass.
SEGMENT_PIECES = st.sampled_from(
    [b"x", b"models", b"gpt-4o", b"%20", b"%c3%a9", b"~", b":", b";", b"=", b"%41", b"."]
    + [b"..", b"%2e", b"%2f", b"@", b"%5c", b"%25", b"+", b"!", b"$", b"'", b"(", b"*"]
)
SEGMENTS = st.lists(SEGMENT_PIECES, min_size=1, max_size=4).map(b"".join)
RAW_PATHS = st.one_of(
    st.binary(max_size=64),
    st.lists(PATH_PIECES, max_size=12).map(lambda parts: b"/v1/" + b"".join(parts)),
    st.lists(PATH_PIECES, max_size=12).map(b"".join),
    st.lists(SEGMENTS, min_size=1, max_size=5).map(lambda s: b"/v1/" + b"/".join(s)),
)
QUERIES = st.one_of(
    st.just(b""), st.binary(max_size=24), st.lists(PATH_PIECES, max_size=6).map(b"".join)
)
_ESCAPES = (b"%2f", b"%5c", b"%2e", b"%25")


@settings(max_examples=500, deadline=None)
@given(raw_path=RAW_PATHS, query=QUERIES, root=st.sampled_from(ROOTS))
def test_relay_target_refuses_or_stays_on_the_configured_upstream(
    raw_path: bytes, query: bytes, root: httpx2.URL
) -> None:
    try:
        target = relay_target(raw_path, query)
    except UnsafePath:
        return
    url = upstream_url(root, target)  # its own guard raises UnsafePath: that would fail here
    assert (url.scheme, url.host, url.port) == (root.scheme, root.host, root.port)
    # As sent, and as anything downstream would re-parse it.
    reparsed = httpx2.URL(str(url))
    assert (reparsed.scheme, reparsed.host, reparsed.port) == (root.scheme, root.host, root.port)
    base = root.raw_path.rstrip(b"/")
    path, _, sent_query = url.raw_path.partition(b"?")
    assert path.startswith(base + b"/")
    segments = path[len(base) + 1 :].split(b"/")
    assert all(s not in (b"", b".", b"..") for s in segments)
    assert not any(c in path for c in (b"@", b"\\")) and all(0x20 < c < 0x7F for c in path)
    assert not any(escape in path.lower() for escape in _ESCAPES)
    assert all(0x20 <= c < 0x7F for c in sent_query) and b"#" not in sent_query


# -- the suite, end to end ----------------------------------------------------------------

PROBES = ["1a", "1b", "2", "3", "4", "5", "6", "7", "8", "9"]


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path_factory.mktemp("abuse")
    run = subprocess.run(
        [sys.executable, "-m", "probes.abuse", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    report = orjson.loads((out / "abuse.json").read_bytes())
    return run, report


def probe(report: dict[str, Any], number: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in report["probes"] if p["number"] == number)
    return found


@pytest.mark.timeout(200)
def test_quick_abuse_run_meets_every_expectation(
    quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    run, report = quick_run
    summary = run.stdout[-8000:] + run.stderr[-3000:]
    assert [p["number"] for p in report["probes"]] == PROBES, summary
    assert run.returncode == 0, summary
    assert run.stdout.startswith("## Abuse suite (quick): 10/10"), summary


@pytest.mark.timeout(200)
@pytest.mark.parametrize("number", PROBES)
def test_quick_abuse_probe(
    quick_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]], number: str
) -> None:
    p = probe(quick_run[1], number)
    why = f"{p['name']}: {p['failures']} ({p['outcome']})"
    # What every probe must show, whatever it sent.
    assert p["gateway_alive"], why
    assert p["victim_contacts"] == 0 and not p["secret_leaked"], why
    growth = p["rss_peak_mb"] - p["rss_before_mb"]
    details = p["details"]
    if number in ("1a", "1b"):
        for case in details["cases"]:
            assert case["status"] is not None and case["status"] < 500, case
            assert case["relayed_as"] or case["status"] in (400, 404), case
    elif number == "2":
        assert growth < 50 and p["rss_after_mb"] - p["rss_before_mb"] < 16, why
        assert all(r["status"] == 200 and r["end"] in ("done", "error") for r in details["runs"])
    elif number == "3":
        # While nobody reads; once the clients leave, their runs go on detached (kept
        # for a resume) and read the rest, as any detached run does.
        assert details["rss_growth_while_unread_mb"] < details["bound_mb"], why
        assert max(details["upstream_wrote_per_stream_mb"]) < 16, why
    elif number == "4":
        assert details["deltas"] == details["expected"], why
    elif number == "5":
        assert [c["status"] for c in details["cases"]] == [431, 431, 431], why
        assert growth < 16, why
    elif number == "6":
        assert p["fds_after"] <= p["fds_before"], why
    elif number == "7":
        assert details["closed_after_s"] is not None and details["closed_after_s"] < 2, why
    elif number == "8":
        assert not any(c["key_in_answer"] for c in details["cases"]), why
    elif number == "9":
        assert all(400 <= (c["status"] or 0) < 500 for c in details["cases"]), why
    assert p["passed"], why

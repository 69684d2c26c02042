"""The relayed path: decoded once, checked, re-encoded; the authority is the upstream's."""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.target import (
    UnsafePath,
    relay_query,
    relay_target,
    run_query,
    upstream_url,
)

ROOTS = ["http://vllm:8000", "https://api.deepseek.com/", "http://127.0.0.1:9000/v1"]


@pytest.mark.parametrize(
    "raw",
    [
        b"/v1%2f@evil:1/x",
        b"/v1%2F%2Fevil:1/x",
        b"/v1/%2f@evil:1/x",
        b"/v1/@evil:1/x",
        b"/v1/%40evil:1/x",
        b"/v1//evil:1/x",
        b"/v1/files/a%2Fb",
        b"/v1/a%5cb",
        b"/v1/a\\b",
        b"/v1/../admin",
        b"/v1/%2e%2e/admin",
        b"/v1/.%2E/admin",
        b"/v1/./models",
        b"/v1/%252e%252e/admin",
        b"/v1/a%00b",
        b"/v1/a%0d%0aHost:%20evil",
        b"/v1/a%3Fb",
        b"/v1/a%23b",
        b"/v1/%ff",
        b"/v1",
        b"/admin",
        b"http://evil:1/v1/x",
    ],
)
def test_tricks_are_refused(raw: bytes) -> None:
    with pytest.raises(UnsafePath) as caught:
        relay_target(raw, b"")
    assert caught.value.status_code == 400


@pytest.mark.parametrize(
    ("raw", "query", "target"),
    [
        (b"/v1/files", b"", "/files"),
        (b"/v1/files/file-abc123/content", b"", "/files/file-abc123/content"),
        (b"/v1/files", b"purpose=batch&limit=2", "/files?purpose=batch&limit=2"),
        (b"/v1/models/ft:gpt-4o:org:x", b"", "/models/ft:gpt-4o:org:x"),
        (b"/v1/a%7Eb", b"", "/a~b"),  # unreserved characters are decoded
        (b"/v1/caf%C3%A9", b"", "/caf%C3%A9"),
        (b"/v1/a%20b", b"", "/a%20b"),
    ],
)
def test_real_paths_are_kept(raw: bytes, query: bytes, target: str) -> None:
    assert relay_target(raw, query) == target


@pytest.mark.parametrize("query", [b"a=1#frag", b"a=\x01", b"a=\xff"])
def test_queries_with_unsafe_characters_are_refused(query: bytes) -> None:
    with pytest.raises(UnsafePath):
        relay_target(b"/v1/files", query)


@pytest.mark.parametrize("root", ROOTS)
def test_upstream_url_keeps_the_base_path(root: str) -> None:
    url = upstream_url(httpx2.URL(root), "/files?limit=2")
    base = httpx2.URL(root)
    assert url.host == base.host and url.port == base.port
    assert url.raw_path == base.raw_path.rstrip(b"/") + b"/files?limit=2"


@given(raw=st.binary(max_size=64), query=st.binary(max_size=16), root=st.sampled_from(ROOTS))
def test_no_request_target_changes_the_authority(raw: bytes, query: bytes, root: str) -> None:
    """Whatever bytes arrive as a path: refused, or sent to the configured host and port."""
    base = httpx2.URL(root)
    try:
        target = relay_target(b"/v1/" + raw, query)
    except UnsafePath:
        return
    url = upstream_url(base, target)
    assert (url.scheme, url.host, url.port, url.userinfo) == (
        base.scheme,
        base.host,
        base.port,
        base.userinfo,
    )
    assert url.raw_path.startswith(base.raw_path.rstrip(b"/") + b"/")
    assert b".." not in url.raw_path.split(b"?")[0].split(b"/")
    # What an HTTP server would read as the path has the upstream's base path in front.
    reparsed = httpx2.URL(str(url))
    assert (reparsed.host, reparsed.port) == (base.host, base.port)


def test_a_run_forwards_the_query_as_the_client_sent_it() -> None:
    assert relay_query(b"") == ""
    assert relay_query(b"beta=true") == "?beta=true"
    assert relay_query(b"api-version=2024-10-21&x=%20") == "?api-version=2024-10-21&x=%20"
    for unsafe in (b"a=\x01", b"a=\xff", b"a#b"):
        with pytest.raises(UnsafePath):
            relay_query(unsafe)


def test_a_runs_query_leaves_its_credentials_out() -> None:
    assert run_query(b"beta=true") == "?beta=true"
    assert run_query(b"beta=true&key=AIza123&api-version=1") == "?beta=true&api-version=1"
    assert run_query(b"API_KEY=x&access%5Ftoken=y") == ""
    assert run_query(b"") == ""

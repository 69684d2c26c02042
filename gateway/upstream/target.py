"""Where a relayed request goes: the configured upstream, never a host the request names.

ARCHITECTURE.md section 6a. A pass-through path is decoded once, checked segment
by segment and re-encoded (``relay_target``); the upstream URL is then the
upstream's own parsed URL with that path set as its raw path (``upstream_url``),
so no byte of the request is ever parsed as a scheme, a userinfo or a host.

Refused, with a 400: encoded slashes and backslashes (a proxy behind us, or the
upstream, may decode them into separators), ``.``/``..`` segments and empty ones
(``//``), ``@``, a ``%`` left after decoding (double encoding), control
characters, and anything that is not UTF-8. Nothing a real API path holds.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

import httpx2

from gateway.errors import InvalidRequest

PREFIX = "/v1/"
# RFC 3986 pchar, less "@" (refused): kept as is when the segment is re-encoded.
_PCHAR_SAFE = "!$&'()*+,;=:~"
_FORBIDDEN = frozenset("/\\@%?#") | {chr(c) for c in range(0x20)} | {"\x7f"}


class UnsafePath(InvalidRequest):
    code = "invalid_path"


def relay_target(raw_path: bytes, query: bytes) -> str:
    """The path under ``/v1`` (with its query) to send upstream, normalised.

    ``raw_path`` is the request target's path as received (percent-encoded).
    """
    text = raw_path.decode("latin-1")
    if not text.startswith(PREFIX):
        raise UnsafePath(f"Unsupported path {text!r}: it must start with {PREFIX}.")
    segments = []
    for raw in text[len(PREFIX) - 1 :].split("/")[1:]:
        try:
            segment = unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise UnsafePath(f"The path segment {raw!r} is not valid UTF-8.") from None
        if segment in ("", ".", "..") or not _FORBIDDEN.isdisjoint(segment):
            raise UnsafePath(f"The path segment {raw!r} is not allowed.")
        segments.append(quote(segment, safe=_PCHAR_SAFE))
    return "/" + "/".join(segments) + relay_query(query)


def relay_query(query: bytes) -> str:
    """The client's query string as it goes upstream (``?…``, or "" when it sent none).

    Passed as received (``?beta=true``, Azure's ``api-version``…): printable ASCII only.
    """
    if not query:
        return ""
    # The server already split the query off at the first "?"; it holds no "#".
    text_query = query.decode("latin-1")
    if not text_query.isprintable() or not text_query.isascii() or "#" in text_query:
        raise UnsafePath("The query string holds characters that are not allowed.")
    return f"?{text_query}"


# Query parameters that carry a credential (Google's ``?key=``, ``?access_token=``…): a
# run's query goes to every leg, fallbacks on other providers included, and is kept in
# the run's record, so these never go with it.
CREDENTIAL_PARAMETERS = frozenset(
    {"key", "api-key", "api_key", "apikey", "access_token", "token", "auth", "authorization"}
)


def run_query(query: bytes) -> str:
    """The client's query string as a run sends it with every leg (``relay_query``),
    without its credential parameters (``CREDENTIAL_PARAMETERS``)."""
    checked = relay_query(query)
    if not checked:
        return ""
    kept = [
        part
        for part in checked[1:].split("&")
        if unquote(part.partition("=")[0]).lower() not in CREDENTIAL_PARAMETERS
    ]
    return "?" + "&".join(kept) if any(kept) else ""


def upstream_url(root: httpx2.URL, target: str) -> httpx2.URL:
    """``target`` (from ``relay_target`` or a constant) under ``root``, same authority."""
    base = root.raw_path.split(b"?", 1)[0].rstrip(b"/")
    url = root.copy_with(raw_path=base + target.encode("ascii"))
    if (url.scheme, url.host, url.port) != (root.scheme, root.host, root.port):
        # Unreachable by construction; a guard, so a later change cannot open the hole.
        raise UnsafePath("The request would leave the configured upstream.")
    return url

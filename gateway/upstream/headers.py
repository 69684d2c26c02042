"""Which headers cross the gateway, each way (policy only, no I/O).

Requests, chat completions and pass-through alike (``forwarded_request_headers``):
a client's end-to-end headers go upstream (``OpenAI-Organization``,
``OpenAI-Project``, ``OpenAI-Beta``, ``User-Agent``, the SDKs' ``X-Stainless-*``,
``traceparent`` …), except

- hop-by-hop headers (RFC 9110 section 7.6.1), and any the client's ``Connection`` names;
- ``host``, ``content-length`` and ``expect``: they frame the client's request to the
  gateway, not the gateway's to the upstream;
- the gateway's own ``x-run-id`` and ``x-resume-from`` (and an EventSource's
  ``Last-Event-ID``): they address a run here;
- ``cookie``: the gateway origin's, nothing an API upstream should see;
- credentials (``authorization``, ``x-api-key``, ``api-key``, ``x-goog-api-key``): the
  client's go only to an upstream without a credential of its own, and only when the
  gateway has no keys (``UpstreamClient.request_headers``). ``authorization`` takes that
  path separately, because a gateway with keys checks it and never forwards it.

The upstream's configured ``headers`` and key are applied last, so they win over a
client's. A chat completion also sets ``content-type``, ``accept`` and
``accept-encoding`` itself: the gateway, not the client, reads that stream.

Responses: pass-through relays the upstream's body, so the upstream's end-to-end
headers come back with it (``end_to_end_headers``). A chat completion's body is the
gateway's own (spliced, or assembled), so only the upstream's request metadata comes
back (``answer_metadata``): ``x-request-id``, ``openai-*`` (processing time,
organization, project, version) and ``x-ratelimit-*`` (Anthropic's ``request-id``
and ``anthropic-ratelimit-*``), from the response the answer
started with. Its ``content-type``, ``set-cookie`` and the like describe a body the
client never sees.
"""

from __future__ import annotations

from collections.abc import Iterable

# RFC 9110 section 7.6.1 (and the non-standard proxy-connection), plus the headers
# httpx2 sets from the body it sends.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Never copied from a client's request, whatever the mode.
NOT_FORWARDED = HOP_BY_HOP | {
    "expect",
    "cookie",
    "authorization",
    "x-run-id",
    "x-resume-from",
    "last-event-id",
}
# A client's credentials besides Authorization (Anthropic-style, Azure-style, Google's).
CREDENTIALS = frozenset({"x-api-key", "api-key", "x-goog-api-key"})
# An upstream that configures one of these has a credential of its own.
OWN_CREDENTIALS = CREDENTIALS | {"authorization"}

ANSWER_METADATA = frozenset({"x-request-id", "request-id"})  # OpenAI's, Anthropic's
ANSWER_METADATA_PREFIXES = ("openai-", "x-ratelimit-", "anthropic-ratelimit-")


def end_to_end_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


def forwarded_request_headers(
    headers: Iterable[tuple[str, str]], *, credentials: bool
) -> dict[str, str]:
    """The client's headers that may go upstream (lower-case names).

    ``credentials``: whether the client's own credentials may (the gateway has no
    keys); ``UpstreamClient.request_headers`` still drops them for an upstream
    with a key of its own.
    """
    pairs = [(k.lower(), v) for k, v in headers]
    named = {
        token.strip().lower()
        for k, v in pairs
        if k == "connection"
        for token in v.split(",")
        if token.strip()
    }
    return {
        k: v
        for k, v in pairs
        if k not in NOT_FORWARDED and k not in named and (credentials or k not in CREDENTIALS)
    }


def answer_metadata(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """What a chat completion's client gets of the upstream's response headers."""
    return {
        name: v
        for k, v in headers
        if (name := k.lower()) in ANSWER_METADATA or name.startswith(ANSWER_METADATA_PREFIXES)
    }

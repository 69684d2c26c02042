"""Upstream SSE bodies to event payloads, on httpx-sse's spec-conformant decoder.

httpx decodes UTF-8 incrementally (a character split across network reads is
joined) and httpx-sse splits lines on CRLF, CR or LF, drops comments and folds
multi-line ``data:`` fields. An event cut off by the end of the body (no blank
line after it) is discarded, as the SSE spec says: a half-received JSON chunk is
never parsed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from httpx_sse import EventSource, SSEError

from gateway.errors import UpstreamFailure


async def aiter_data(response: httpx.Response) -> AsyncIterator[str]:
    """Yield the ``data`` of each event; events without data (pings) are skipped."""
    try:
        async for event in EventSource(response).aiter_sse():
            if event.data:
                yield event.data
    except SSEError as exc:
        raise UpstreamFailure(
            f"The upstream answered a streaming request without an event stream: {exc}",
            code="upstream_bad_response",
        ) from None

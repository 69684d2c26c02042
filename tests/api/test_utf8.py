"""Invalid UTF-8 from an upstream: replaced as a direct client would see it, never dropped."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from openai import OpenAI

from tests.api.streams import MESSAGES, stream_chat
from tests.raw_upstream import RawRequest, chat_chunk, running_raw_upstream, sse_head
from tests.servers import gateway_config, running_gateway


def invalid_utf8(index: int, request: RawRequest) -> Iterable[bytes]:
    """Five content events, each with a byte sequence that is not UTF-8 (a broken encoder)."""
    yield sse_head()
    yield chat_chunk("", role="assistant")
    for n in range(5):
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "w%d\xff\xc3 "}}]}\n\n' % n
    yield chat_chunk(finish="stop") + b"data: [DONE]\n\n"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_invalid_utf8_from_the_upstream_is_replaced_never_dropped(stream: bool) -> None:
    """What a direct client's decoder shows (U+FFFD), not 4 of 5 events gone silently."""
    expected = "".join(f"w{n}\ufffd\ufffd " for n in range(5))
    with (
        running_raw_upstream(invalid_utf8) as upstream,
        running_gateway(gateway_config(upstream.base_url)) as gateway,
        OpenAI(base_url=gateway.base_url, api_key="k", max_retries=0) as client,
    ):
        if stream:
            assert stream_chat(client, "raw").text == expected
        else:
            completion = client.chat.completions.create(model="raw", messages=MESSAGES)
            assert completion.choices[0].message.content == expected

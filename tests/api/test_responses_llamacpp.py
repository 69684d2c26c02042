"""llama.cpp's Responses dialect end to end: its recorded events, cut mid-answer.

llama.cpp's server (``llama-server``) streams ``/v1/responses`` events without
``output_index``, ``content_index`` or ``sequence_number``. Here an upstream on loopback
replays what it was recorded sending (``tests/protocols/test_responses_splice.py``):
the first answer reset after its 15th text delta, then its continuation of the text the
client has. The gateway in front, the openai SDK as the client: one answer, the first
leg's text and then the rest, and every event that says the text says that one.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from openai import OpenAI
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.api.test_responses import Streamed, check_contract
from tests.protocols.test_responses_splice import (
    LLAMACPP_CONTINUATION,
    LLAMACPP_CUT,
    LLAMACPP_REST,
    LLAMACPP_SENT,
)
from tests.raw_upstream import (
    RESET,
    RawRequest,
    RawUpstream,
    Reset,
    Script,
    running_raw_upstream,
    sse_head,
)
from tests.servers import RunningGateway, gateway_config, running_gateway

ANSWER = LLAMACPP_SENT + LLAMACPP_REST
LIFECYCLE = {"response.created", "response.in_progress", "response.completed"}
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
RESPONSES = b"POST /v1/responses "


def llamacpp_script() -> Script:
    """``POST /v1/responses``: first the recorded answer up to its cut, then a TCP reset;
    then the recorded continuation, whole. Anything else (a ``GET /models``): 404."""
    posts = itertools.count()

    def script(index: int, request: RawRequest) -> Iterator[bytes | Reset]:
        if not request.head.startswith(RESPONSES):
            yield b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
        elif next(posts) == 0:
            yield sse_head() + LLAMACPP_CUT
            yield RESET
        else:
            yield sse_head() + LLAMACPP_CONTINUATION

    return script


@contextlib.contextmanager
def gateway() -> Iterator[tuple[RunningGateway, RawUpstream]]:
    with running_raw_upstream(llamacpp_script()) as upstream:
        config = gateway_config(
            upstream.base_url,
            # llama.cpp goes on from a trailing assistant message, as it did recorded.
            upstream={"continuation": "prefill"},
            routes=[{"match": "*", "upstream": "chaos", "retry": {"backoff_initial": 0.01}}],
        )
        with running_gateway(config) as running:
            yield running, upstream


def continued_from_the_text_sent(upstream: RawUpstream) -> None:
    """The second request asked for the rest of what the client had, as llama.cpp takes
    it: a typed assistant message."""
    bodies = [orjson.loads(r.body) for r in upstream.requests if r.head.startswith(RESPONSES)]
    assert len(bodies) == 2
    first, second = bodies
    assert second["input"][:-1] == [{"role": "user", "content": first["input"]}]
    assert second["input"][-1] == {"type": "message", "role": "assistant", "content": LLAMACPP_SENT}


def test_the_sdks_stream_gets_the_first_legs_text_and_the_rest() -> None:
    with gateway() as (running, upstream):
        with OpenAI(base_url=running.base_url, api_key="k", max_retries=0) as client:
            streamed = Streamed()
            with client.responses.stream(
                model="smollm2", input="Tell me about Paris.", temperature=0
            ) as stream:
                streamed.events = list(stream)
                streamed.final = stream.get_final_response()
    continued_from_the_text_sent(upstream)
    check_contract(streamed)
    assert streamed.text() == ANSWER
    assert streamed.final.status == "completed" and streamed.final.output_text == ANSWER
    [completed] = [e for e in streamed.events if e.type == "response.completed"]
    assert completed.response.output_text == ANSWER
    assert [e.text for e in streamed.events if e.type == "response.output_text.done"] == [ANSWER]


@pytest.mark.parametrize("client", ["sdk", "raw"])
def test_every_event_is_openais_shape_and_says_the_text_streamed(client: str) -> None:
    with gateway() as (running, upstream):
        if client == "sdk":
            with OpenAI(base_url=running.base_url, api_key="k", max_retries=0) as sdk:
                stream = sdk.responses.create(
                    model="smollm2", input="Tell me about Paris.", stream=True
                )
                sent = [event.model_dump(exclude_unset=True) for event in stream]
        else:
            import httpx2

            body = {"model": "smollm2", "input": "Tell me about Paris.", "stream": True}
            raw = httpx2.post(running.base_url + "/responses", json=body, timeout=20).content
            sent = [
                orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")
            ]
    continued_from_the_text_sent(upstream)
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta") == ANSWER
    final = sent[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["output"][0]["content"][0]["text"] == ANSWER
    for event in sent:
        if event["type"] not in LIFECYCLE:
            # Validated, not constructed: every index, part and field OpenAI's has. (The
            # response object is llama.cpp's, without the request's tools and choices.)
            STREAM_EVENT.validate_python(event)
        if "output_index" in event:
            assert event["output_index"] == 0
        if "content_index" in event:
            assert event["content_index"] == 0

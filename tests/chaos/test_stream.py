"""Clean streams over real sockets: the answer, the chunk shape and the wire-format variants."""

from __future__ import annotations

import json
import time

import httpx2
import pytest

from gateway.chaos import ChaosUpstream, expected_answer

from .helpers import USER, decode_sse, stream


def test_clean_stream_decodes_to_the_expected_answer(client: httpx2.Client) -> None:
    received = stream(client, "chaos")
    assert received.status == 200
    assert received.headers["content-type"] == "text/event-stream"
    assert received.headers["cache-control"] == "no-cache"
    assert received.headers["transfer-encoding"] == "chunked"
    assert received.error is None
    collected = received.collect()
    assert collected.text == expected_answer("chaos").text
    assert collected.finish_reasons == ["stop"]
    assert collected.roles == ["assistant"]
    assert received.data[-1] == "[DONE]"


def test_every_chunk_has_the_openai_shape(client: httpx2.Client) -> None:
    received = stream(client, "chaos:text=3")
    chunks = [json.loads(item) for item in received.data[:-1]]
    assert len(chunks) == 5  # role, three deltas, finish
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-chaos-")
    assert len({chunk["created"] for chunk in chunks}) == 1
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["model"] == "chaos:text=3"
        assert chunk["system_fingerprint"] == "fp_chaos"
        [choice] = chunk["choices"]
        assert choice["index"] == 0 and choice["logprobs"] is None
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "finish_reason": "stop",
        "logprobs": None,
    }
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-1])


def test_reasoning_comes_before_text_and_tools_after(client: httpx2.Client) -> None:
    spec = "chaos:text=5,reasoning=4,tools=2,arg_deltas=3"
    received = stream(client, spec)
    collected = received.collect()
    answer = expected_answer(spec)
    assert collected.reasoning == answer.reasoning
    assert collected.text == answer.text
    assert collected.finish_reasons == ["tool_calls"]
    assert collected.content_deltas == 4 + 5 + 2 * 3
    assert [
        (call["id"], call["name"], call["arguments"]) for call in collected.tool_calls.values()
    ] == [(call.id, call.name, call.arguments) for call in answer.tool_calls]
    kinds = []
    for item in received.data[1:-2]:
        delta = json.loads(item)["choices"][0]["delta"]
        kinds.append(next(iter(delta)))
    assert kinds == ["reasoning_content"] * 4 + ["content"] * 5 + ["tool_calls"] * 8
    header = json.loads(received.data[10])["choices"][0]["delta"]["tool_calls"][0]
    assert header == {
        "index": 0,
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "tool_0", "arguments": ""},
    }


def test_usage_only_when_asked_by_the_request(client: httpx2.Client) -> None:
    asked = {"include_usage": True}
    assert stream(client, "chaos:text=4,usage=1").collect().usage is None
    assert stream(client, "chaos:text=4", stream_options=asked).collect().usage is None
    received = stream(client, "chaos:text=4,reasoning=2,usage=1", stream_options=asked)
    usage_chunk = json.loads(received.data[-2])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17}


def test_done_can_be_omitted(client: httpx2.Client) -> None:
    received = stream(client, "chaos:text=2,done=0")
    assert received.error is None
    assert "[DONE]" not in received.data
    assert received.collect().finish_reasons == ["stop"]


@pytest.mark.parametrize("split", [1, 2, 3, 7])
def test_split_writes_still_decode_to_the_answer(client: httpx2.Client, split: int) -> None:
    spec = f"chaos:text=12,tools=1,split={split}"
    received = stream(client, spec)
    assert max(len(piece) for piece in received.chunks) <= split
    collected = received.collect()
    assert collected.text == expected_answer(spec).text
    assert collected.tool_calls[0]["arguments"] == expected_answer(spec).tool_calls[0].arguments


def test_split_pieces_cut_multibyte_characters(client: httpx2.Client) -> None:
    received = stream(client, "chaos:text=8,split=2")
    undecodable = 0
    for piece in received.chunks:
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            undecodable += 1
    assert undecodable > 0


@pytest.mark.parametrize(
    ("lineend", "terminator"), [("lf", b"\n\n"), ("crlf", b"\r\n\r\n"), ("cr", b"\r\r")]
)
def test_line_endings(client: httpx2.Client, lineend: str, terminator: bytes) -> None:
    spec = f"chaos:text=6,lineend={lineend}"
    received = stream(client, spec)
    raw = received.raw
    assert raw.endswith(b"data: [DONE]" + terminator)
    assert raw.count(terminator) == 6 + 3
    other_breaks = raw.replace(terminator, b"")
    assert b"\n" not in other_breaks and b"\r" not in other_breaks
    assert received.collect().text == expected_answer(spec).text


def test_comments_and_event_fields_are_interleaved(client: httpx2.Client) -> None:
    spec = "chaos:text=6,comments=1"
    received = stream(client, spec)
    assert received.raw.count(b": keepalive\n") == 6 + 3
    assert received.raw.count(b"event: message\ndata: ") == 6 + 3
    assert received.raw.startswith(b": keepalive\n\nevent: message\n")
    assert received.collect().text == expected_answer(spec).text


@pytest.mark.parametrize("variant", ["lineend=crlf", "lineend=cr", "comments=1,split=1"])
def test_httpx2_sse_decodes_every_variant(upstream: ChaosUpstream, variant: str) -> None:
    spec = f"chaos:text=9,{variant}"
    body = {"model": spec, "messages": [USER], "stream": True}
    with (
        httpx2.Client(base_url=upstream.base_url, timeout=10) as client,
        client.sse("/chat/completions", method="POST", json=body) as source,
    ):
        data = [event.data for event in source if event.data]
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1])
    assert text == expected_answer(spec).text


def test_pace_spreads_the_deltas(client: httpx2.Client) -> None:
    started = time.monotonic()
    received = stream(client, "chaos:text=4,pace_ms=30")
    assert time.monotonic() - started >= 0.15  # six gaps between seven events
    assert len(decode_sse(received.raw)) == 7


def test_first_byte_delay(client: httpx2.Client) -> None:
    started = time.monotonic()
    with client.stream(
        "POST", "/chat/completions", json={"model": "chaos:first_byte_ms=200", "stream": True}
    ) as response:
        assert time.monotonic() - started >= 0.2
        response.read()


def test_x_chaos_header_overrides_the_model(client: httpx2.Client) -> None:
    received = stream(client, "gpt-4o", headers={"x-chaos": "chaos:text=2"})
    assert received.collect().text == expected_answer("chaos:text=2").text
    assert json.loads(received.data[0])["model"] == "gpt-4o"


def test_unknown_model_gets_the_default_answer(client: httpx2.Client) -> None:
    assert stream(client, "gpt-4o").collect().text == expected_answer("chaos").text


def test_keeps_the_connection_alive_between_streams(client: httpx2.Client) -> None:
    ports = set()
    for _ in range(3):
        with client.stream(
            "POST", "/chat/completions", json={"model": "chaos", "stream": True}
        ) as r:
            r.read()
            stream_info = r.extensions["network_stream"]
            ports.add(stream_info.get_extra_info("client_addr")[1])
    assert len(ports) == 1

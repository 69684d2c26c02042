"""Non-streaming answers, the other endpoints, the request record and bad input."""

from __future__ import annotations

import base64
import json
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import openai
import pytest

from gateway.chaos import ChaosUpstream, expected_answer, running_chaos_upstream

from .helpers import USER, json_document, stream


def test_non_streaming_chat_completion(client: httpx2.Client) -> None:
    spec = "chaos:text=7,reasoning=2,tools=2"
    document = json_document(
        client.post("/chat/completions", json={"model": spec, "messages": [USER]})
    )
    answer = expected_answer(spec)
    assert document["object"] == "chat.completion"
    assert document["id"].startswith("chatcmpl-chaos-")
    assert document["model"] == spec
    [choice] = document["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["content"] == answer.text
    assert message["reasoning_content"] == answer.reasoning
    assert message["tool_calls"] == [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in answer.tool_calls
    ]
    # usage is always there: 2 reasoning + 7 text + 2 calls of 4 fragments
    assert document["usage"] == {"prompt_tokens": 11, "completion_tokens": 17, "total_tokens": 28}


def test_non_streaming_ignores_in_band_faults(client: httpx2.Client) -> None:
    for fault in ("error", "stall", "no_finish", "malformed", "finish_error"):
        body = {"model": f"chaos:text=3,fault={fault}", "messages": [USER]}
        message = client.post("/chat/completions", json=body).json()["choices"][0]["message"]
        assert message["content"] == expected_answer("chaos:text=3").text


def test_non_streaming_reset_and_close_cut_the_body(client: httpx2.Client) -> None:
    body = {"model": "chaos:fault=reset", "messages": [USER]}
    with pytest.raises(httpx2.ReadError):
        client.post("/chat/completions", json=body)
    body = {"model": "chaos:fault=close", "messages": [USER]}
    with pytest.raises(httpx2.RemoteProtocolError, match="without sending complete message body"):
        client.post("/chat/completions", json=body)


def test_models(client: httpx2.Client) -> None:
    assert client.get("/models").json() == {
        "object": "list",
        "data": [{"id": "chaos", "object": "model", "created": 0, "owned_by": "chaos"}],
    }


def test_embeddings_are_deterministic(client: httpx2.Client) -> None:
    body = {"model": "chaos", "input": ["hello", "世界", "hello"]}
    document = client.post("/embeddings", json=body).json()
    assert document["object"] == "list"
    vectors = [item["embedding"] for item in document["data"]]
    assert [item["index"] for item in document["data"]] == [0, 1, 2]
    assert all(len(vector) == 8 for vector in vectors)
    assert all(-1 <= value <= 1 for vector in vectors for value in vector)
    assert vectors[0] == vectors[2] != vectors[1]
    single = client.post("/embeddings", json={"model": "chaos", "input": "hello"}).json()
    assert single["data"][0]["embedding"] == vectors[0]
    assert document["usage"]["prompt_tokens"] == document["usage"]["total_tokens"] == 3


def test_embeddings_in_base64(client: httpx2.Client) -> None:
    plain = client.post("/embeddings", json={"model": "chaos", "input": "x"}).json()
    body = {"model": "chaos", "input": "x", "encoding_format": "base64"}
    encoded = client.post("/embeddings", json=body).json()["data"][0]["embedding"]
    floats = struct.unpack("<8f", base64.b64decode(encoded))
    assert floats == pytest.approx(plain["data"][0]["embedding"], abs=1e-6)


def test_embeddings_take_http_faults_and_reject_bad_input(client: httpx2.Client) -> None:
    body = {"model": "chaos:fault=http_429", "input": "x"}
    assert client.post("/embeddings", json=body).status_code == 429
    assert client.post("/embeddings", json={"model": "chaos", "input": 3}).status_code == 400


def test_legacy_completions_stream(client: httpx2.Client) -> None:
    received = stream(
        client, "chaos:text=5,usage=1", path="/completions", stream_options={"include_usage": True}
    )
    chunks = [json.loads(item) for item in received.data[:-1]]
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
    assert text == expected_answer("chaos:text=5").text
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert received.data[-1] == "[DONE]"


def test_legacy_completions_faults(client: httpx2.Client) -> None:
    received = stream(client, "chaos:fault=close,at=3", path="/completions")
    assert isinstance(received.error, httpx2.RemoteProtocolError)
    texts = [json.loads(item)["choices"][0]["text"] for item in received.data]
    assert "".join(texts) == expected_answer("chaos").text[: len("".join(texts))]
    assert len(texts) == 3


def test_legacy_completions_non_streaming(client: httpx2.Client) -> None:
    document = client.post("/completions", json={"model": "chaos", "prompt": "Hi"}).json()
    assert document["object"] == "text_completion"
    assert document["choices"][0]["text"] == expected_answer("chaos").text
    assert document["choices"][0]["finish_reason"] == "stop"
    assert document["usage"]["completion_tokens"] == 20


def test_requests_are_recorded(upstream: ChaosUpstream, client: httpx2.Client) -> None:
    body = {"model": "chaos:text=1", "messages": [USER], "stream": True}
    client.post("/chat/completions", json=body, headers={"X-Trace": "abc"})
    client.get("/models")
    [chat, models] = upstream.requests
    assert (chat.method, chat.path, chat.body) == ("POST", "/v1/chat/completions", body)
    assert chat.headers["x-trace"] == "abc"
    assert chat.headers["content-type"] == "application/json"
    assert (models.method, models.path, models.body) == ("GET", "/v1/models", None)
    record = f"http://127.0.0.1:{upstream.port}/_chaos/requests"
    recorded = client.get(record).json()  # the record does not record itself
    assert [item["path"] for item in recorded] == ["/v1/chat/completions", "/v1/models"]
    assert recorded[0]["body"] == body and recorded[0]["headers"]["x-trace"] == "abc"
    assert client.delete(record).json() == {"deleted": 2}
    assert client.get("/_chaos/requests").json() == []  # also under the base URL
    assert upstream.requests == []


def test_bad_spec_is_a_400_with_an_openai_error(client: httpx2.Client) -> None:
    for body, headers in (
        ({"model": "chaos:fault=explode"}, {}),
        ({"model": "gpt-4o"}, {"x-chaos": "chaos:nope=1"}),
    ):
        response = client.post("/chat/completions", json=body, headers=headers)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "invalid_chaos_spec"
        assert "invalid chaos spec" in error["message"]


def test_unknown_path_is_a_404(client: httpx2.Client) -> None:
    response = client.post("/audio/speech", json={"model": "chaos"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert client.get("/chat/completions").status_code == 404


def test_invalid_json_is_a_400(client: httpx2.Client) -> None:
    response = client.post(
        "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "parse the JSON" in response.json()["error"]["message"]
    assert client.post("/chat/completions", json=[1, 2]).status_code == 400


def _raw_exchange(upstream: ChaosUpstream, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_malformed_request_line_closes_only_that_connection(
    upstream: ChaosUpstream, client: httpx2.Client
) -> None:
    answer = _raw_exchange(upstream, b"THIS IS NOT HTTP\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"connection: close" in answer
    tls_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    assert _raw_exchange(upstream, tls_hello).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert _raw_exchange(upstream, b"POST /v1/models HTTP/1.1\r\nhost: x\r\ncontent-len") == b""
    assert client.get("/models").status_code == 200


def test_keep_alive_and_chunked_request_bodies(upstream: ChaosUpstream) -> None:
    body = json.dumps({"model": "chaos:text=2"}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    answer = _raw_exchange(
        upstream,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
        b"connection: close\r\n\r\n" + chunked,
    )
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert expected_answer("chaos:text=2").text.encode() in answer


def test_closing_drops_stalled_connections() -> None:
    with running_chaos_upstream() as upstream:
        sock = socket.create_connection(("127.0.0.1", upstream.port), timeout=5)
        body = b'{"model": "chaos:fault=stall,at=1", "stream": true}'
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        started = time.monotonic()
    with sock:
        assert time.monotonic() - started < 5
        try:
            rest = sock.recv(65536)
        except ConnectionResetError:
            rest = b""
        while rest and (more := sock.recv(65536)):
            rest += more
        assert b"0\r\n\r\n" not in rest  # dropped, not finished


def test_the_openai_sdk_reads_it(upstream: ChaosUpstream) -> None:
    spec = "chaos:text=8,tools=1,usage=1"
    with openai.OpenAI(base_url=upstream.base_url, api_key="chaos", max_retries=0) as sdk:
        chunks = list(
            sdk.chat.completions.create(
                model=spec,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        embedding = sdk.embeddings.create(model="chaos", input="hello").data[0].embedding
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == expected_answer(spec).text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8 + 4
    assert len(embedding) == 8


def test_open_connections_counts_live_connections(upstream: ChaosUpstream) -> None:
    assert upstream.open_connections == 0
    with httpx2.Client(base_url=upstream.base_url) as client:
        client.get("/models")
        assert upstream.open_connections == 1  # idle in keep-alive
    deadline = time.monotonic() + 5
    while upstream.open_connections:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_python_m_gateway_chaos_serves_and_says_where() -> None:
    command = [sys.executable, "-m", "gateway.chaos", "--port", "0"]
    root = Path(__file__).parents[2]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=root) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("chaos upstream listening on http://127.0.0.1:")
            base_url = line.split()[-1]
            assert base_url.endswith("/v1")
            assert httpx2.get(base_url + "/models").json()["data"][0]["id"] == "chaos"
        finally:
            process.terminate()
            process.wait(10)

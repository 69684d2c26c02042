"""The Gemini API end to end: real sockets, the chaos upstream's Gemini doors, the
google-genai SDK as the client.

Beside the SDK's own reading, the raw stream is checked for the section 2b contract:
nothing but ``data:`` events, each a ``GenerateContentResponse`` the newest SDK's
types accept (they forbid unknown fields), one ``responseId`` and ``modelVersion``,
content parts in every chunk, one ``finishReason`` on the last — or Google's raw error
object at the end and no ``finishReason``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest
from google import genai
from google.genai import errors, types

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.chaos import gemini as chaos_gemini
from gateway.chaos.answer import script_for
from gateway.chaos.spec import parse_spec
from gateway.config.schema import GatewayConfig
from tests.api.streams import first_raw_events
from tests.servers import RunningGateway, recovering_config, running_gateway

FAULTS = ["reset", "close", "stall", "no_finish", "error", "error_data", "malformed"]
THOUGHTS = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
STREAM = "/v1beta/models/{}:streamGenerateContent?alt=sse"


def config(chaos: ChaosUpstream, **overrides: Any) -> GatewayConfig:
    upstream = {"kind": "gemini"} | overrides.pop("upstream", {})
    root = chaos.base_url.removesuffix("/v1") + "/v1beta"
    return recovering_config(root, upstream=upstream, **overrides)


@pytest.fixture(scope="module")
def recovering(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(config(chaos)) as running:
        yield running


def sdk_for(gateway: RunningGateway, key: str = "k") -> genai.Client:
    options = types.HttpOptions(
        base_url=gateway.url,
        api_version="v1beta",
        retry_options=types.HttpRetryOptions(attempts=1),  # the gateway's retries only
    )
    return genai.Client(api_key=key, http_options=options)


@pytest.fixture
def sdk(recovering: RunningGateway) -> genai.Client:
    return sdk_for(recovering)


def post(gateway: RunningGateway, model: str, body: dict[str, Any] | None = None) -> bytes:
    body = {"contents": [{"role": "user", "parts": [{"text": "Tell me."}]}]} | (body or {})
    with httpx2.Client(base_url=gateway.url, timeout=20) as http:
        response = http.post(STREAM.format(model), json=body, headers={"x-goog-api-key": "k"})
    assert response.status_code == 200, response.content
    return response.content


def events(raw: bytes) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The chunks of a raw stream, and the error object that ended it (if one did): there
    is nothing else on the wire, no comment, no keepalive."""
    chunks, error = [], None
    for event in raw.split(b"\n\n"):
        if not event:
            continue
        assert error is None, "nothing follows the error object"
        if event.startswith(b"data: "):
            assert b"\n" not in event  # one line: the JS SDK's reader needs it
            chunks.append(orjson.loads(event[6:]))
        else:
            error = orjson.loads(event)
            assert set(error) == {"error"} and set(error["error"]) == {"code", "message", "status"}
    return chunks, error


def check_contract(chunks: list[dict[str, Any]], *, finished: bool = True) -> None:
    """Section 2b, for the chunks a client received."""
    assert chunks
    for chunk in chunks:
        types.GenerateContentResponse.model_validate(chunk)  # the newest SDK's types
        assert chunk["candidates"][0]["content"]["parts"]  # never a chunk without parts
    assert len({c["responseId"] for c in chunks}) == 1
    assert len({c["modelVersion"] for c in chunks}) == 1
    reasons = [i for i, c in enumerate(chunks) if "finishReason" in c["candidates"][0]]
    assert reasons == ([len(chunks) - 1] if finished else [])


def parts(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [part for chunk in chunks for part in chunk["candidates"][0]["content"]["parts"]]


def text(chunks: list[dict[str, Any]], *, thought: bool = False) -> str:
    return "".join(
        p.get("text", "") for p in parts(chunks) if (p.get("thought") is True) == thought
    )


def calls(chunks: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [
        (p["functionCall"]["name"], p["functionCall"]["args"])
        for p in parts(chunks)
        if "functionCall" in p
    ]


def expected_calls(model: str, count: int | None = None) -> list[tuple[str, Any]]:
    answer = expected_answer(model)
    expected = [(c.name, orjson.loads(c.arguments)) for c in answer.tool_calls]
    return expected[:count] if count is not None else expected


def signed(
    chunks: list[dict[str, Any]], door: str = chaos_gemini.DEVELOPER
) -> list[dict[str, Any]]:
    """The parts that carry a signature, each checked: valid on the door that made it."""
    found = [p for p in parts(chunks) if "thoughtSignature" in p]
    for part in found:
        assert chaos_gemini.signature_valid(door, part), part
    return found


def sdk_text(sdk: genai.Client, model: str, config: Any = None) -> tuple[str, str, int]:
    """The answer text, the thoughts and the finish reasons the SDK's stream gave."""
    answer = thoughts = ""
    finishes = 0
    for chunk in sdk.models.generate_content_stream(
        model=model, contents="Tell me.", config=config
    ):
        candidate = chunk.candidates[0] if chunk.candidates else None
        for part in candidate.content.parts or [] if candidate and candidate.content else []:
            if part.thought:
                thoughts += part.text or ""
            else:
                answer += part.text or ""
        finishes += bool(candidate and candidate.finish_reason)
    return answer, thoughts, finishes


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("at", [0, 9, 30], ids=["before-content", "mid-text", "after-last"])
def test_text_survives_every_fault_at_every_point(
    recovering: RunningGateway, sdk: genai.Client, chaos: ChaosUpstream, fault: str, at: int
) -> None:
    model = f"chaos:text=30,seed=600,fault={fault},at={at},times=1"
    assert sdk_text(sdk, model) == (expected_answer(model).text, "", 1)
    # The fault happened, and was recovered by one more request (a bad event is skipped).
    assert len(chaos.requests_for(model)) == (1 if fault == "malformed" else 2)
    other = model.replace("seed=600", "seed=601")
    chunks, error = events(post(recovering, other))
    assert error is None
    check_contract(chunks)
    assert text(chunks) == expected_answer(other).text
    (last,) = signed(chunks)  # a text answer's signature, on its last text part
    assert last is parts(chunks)[-1] or last["text"]


@pytest.mark.parametrize("fault", ["reset", "error", "stall"])
@pytest.mark.parametrize("at", [3, 12], ids=["mid-thoughts", "mid-text"])
def test_thoughts_shown_are_kept_and_never_shown_twice(
    recovering: RunningGateway, sdk: genai.Client, fault: str, at: int
) -> None:
    model = f"chaos:text=20,reasoning=8,seed=610,fault={fault},at={at},times=1"
    answer = expected_answer(model)
    text_seen, thoughts, finishes = sdk_text(sdk, model, THOUGHTS)
    assert text_seen == answer.text and finishes == 1
    # Cut inside the thoughts: the client keeps those it saw, the next leg's are not
    # shown (they would repeat them); cut later: all of them, once.
    deltas = script_for(parse_spec(model)).reasoning_deltas
    assert len(deltas) == 8
    assert thoughts == "".join(deltas[: min(at, len(deltas))])


@pytest.mark.parametrize("fault", ["reset", "error", "no_finish"])
@pytest.mark.parametrize(
    ("at", "count"),
    [
        (0, 2),  # nothing sent: whole restart
        (3, 2),  # mid-text: continue, then both calls
        (6, 2),  # after the text, before the calls
        (7, 1),  # call 0 whole (held), call 1 not come: the answer ends with call 0
        (8, 2),  # both calls whole, the finish not come: they end the answer
    ],
    ids=["before-content", "mid-text", "before-calls", "between-calls", "after-calls"],
)
def test_function_calls_are_whole_once_and_keep_their_signature(
    recovering: RunningGateway, sdk: genai.Client, fault: str, at: int, count: int
) -> None:
    model = f"chaos:text=6,tools=2,seed=620,fault={fault},at={at},times=1"
    chunks, error = events(post(recovering, model))
    assert error is None
    check_contract(chunks)
    assert text(chunks) == expected_answer(model).text
    assert calls(chunks) == expected_calls(model, count)
    (first_call,) = signed(chunks)  # the signature rides on the first call, as it came
    assert first_call["functionCall"]["name"] == expected_calls(model)[0][0]
    other = model.replace("seed=620", "seed=621")
    response = sdk.models.generate_content(model=other, contents="Tell me.")
    assert [(c.name, c.args) for c in response.function_calls or []] == expected_calls(other, count)


def test_a_fatal_error_ends_with_google_error_object_that_the_sdk_raises(
    recovering: RunningGateway, sdk: genai.Client
) -> None:
    model = "chaos:text=30,seed=630,fault=error_fatal,at=9"
    chunks, error = events(post(recovering, model))
    check_contract(chunks, finished=False)
    assert text(chunks) == expected_answer(model).text[: len(text(chunks))]
    assert error is not None and error["error"]["code"] == 400
    assert error["error"]["status"] == "INVALID_ARGUMENT"
    with pytest.raises(errors.ClientError) as raised:
        sdk_text(sdk, model.replace("seed=630", "seed=631"))
    assert raised.value.code == 400


def test_the_error_object_arrives_alone_in_a_read(recovering: RunningGateway) -> None:
    """Gemini's JS SDK (inside Gemini CLI) raises on the error object only when one read
    holds it alone: it goes out after a pause, in a write of its own."""
    body = orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "Tell me."}]}]})
    path = STREAM.format("chaos:text=30,seed=636,fault=error_fatal,at=9")
    host, port = recovering.url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\nx-goog-api-key: k\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    reads = []
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head.encode() + body)
        while data := conn.recv(65536):
            reads.append(data)
    (alone,) = [read for read in reads if b'{"error"' in read]
    assert b"data: " not in alone and reads.index(alone) > 0


def test_a_spent_retry_budget_ends_with_an_error_never_a_clean_end(
    recovering: RunningGateway, sdk: genai.Client
) -> None:
    model = "chaos:text=30,seed=632,fault=reset,at=9"  # every attempt breaks
    chunks, error = events(post(recovering, model))
    check_contract(chunks, finished=False)
    assert error is not None and error["error"]["code"] == 502
    assert error["error"]["status"] == "UNAVAILABLE"
    with pytest.raises(errors.ServerError):
        sdk_text(sdk, model.replace("seed=632", "seed=633"))


@pytest.mark.parametrize("status", ["http_429", "http_503"])
def test_an_error_status_before_the_stream_is_retried(
    sdk: genai.Client, chaos: ChaosUpstream, status: str
) -> None:
    model = f"chaos:text=20,seed=634,fault={status},times=1"
    assert sdk_text(sdk, model) == (expected_answer(model).text, "", 1)
    assert [r.attempt for r in chaos.requests_for(model)] == [0, 1]


def test_non_streaming_gets_the_same_recovery_assembled(
    sdk: genai.Client, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=30,tools=1,seed=640,fault=reset,at=12,times=1"
    response = sdk.models.generate_content(model=model, contents="Tell me.")
    assert response.text == expected_answer(model).text
    assert [(c.name, c.args) for c in response.function_calls or []] == expected_calls(model)
    assert response.candidates and response.candidates[0].finish_reason == "STOP"
    # Usage summed over both legs (the broken one's output estimated): each prompt at
    # least the 11 tokens the chaos upstream counts for the question.
    usage = response.usage_metadata
    assert usage is not None and usage.prompt_token_count and usage.prompt_token_count >= 22
    assert usage.candidates_token_count and usage.total_token_count
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    first, second = chaos.requests_for(model)
    assert second.prefix == expected_answer(model).text[: len(second.prefix or "")]


def test_the_continuation_is_a_prefill_and_a_refused_one_is_learned_per_model(
    chaos: ChaosUpstream,
) -> None:
    with running_gateway(config(chaos)) as gateway:
        sdk = sdk_for(gateway)
        model = "chaos:text=30,seed=650,fault=reset,at=9,times=1"
        assert sdk_text(sdk, model)[0] == expected_answer(model).text
        continued = chaos.requests_for(model)[1].body["contents"]
        assert continued[-1]["role"] == "model"  # a prefill: the text so far, last
        # Gemini 3 refuses a trailing model turn: the chaos upstream too, for its name
        # (the answer's spec in x-chaos). Learned for that model on that upstream.
        for seed, asked in ((651, 3), (652, 2)):  # broken, refused, prompt mode; then learned
            spec = f"chaos:text=30,seed={seed},fault=reset,at=9,times=1"
            options = types.GenerateContentConfig(
                http_options=types.HttpOptions(headers={"x-chaos": spec})
            )
            answer = sdk_text(sdk, "gemini-3-pro-preview", options)[0]
            assert answer == expected_answer(spec).text
            requests = [r for r in chaos.requests if r.headers.get("x-chaos") == spec]
            assert len(requests) == asked
            assert requests[-1].body["contents"][-1]["role"] == "user"
        metric = gateway.metrics.prefill_refusals.labels("chaos", "prefill")
        assert metric._value.get() == 1


def test_a_chat_next_turn_after_a_recovered_function_call_is_accepted(sdk: genai.Client) -> None:
    model = "chaos:text=6,tools=1,seed=660,fault=reset,at=7,times=1"
    chat = sdk.chats.create(model=model)
    for _ in chat.send_message_stream("Tell me."):
        pass
    history = chat.get_history(curated=True)  # the turns the next request carries
    assert [c.role for c in history] == ["user"] + ["model"] * (len(history) - 1)
    assert len(history) > 1  # every chunk valid: the turn was kept
    (call,) = [p.function_call for c in history[1:] for p in c.parts or [] if p.function_call]
    result = types.Part.from_function_response(name=call.name or "", response={"ok": True})
    # The upstream checks the call's signature as Gemini 3 does; it answers in text.
    answer = chat.send_message(result)
    assert answer.text


def test_keys_come_from_any_of_the_three_places_and_never_travel_in_a_query(
    chaos: ChaosUpstream,
) -> None:
    keys = {"auth": {"keys": ["gw-key-0123456789"]}, "upstream": {"api_key": "upstream-key-01"}}
    with running_gateway(config(chaos, **keys)) as gateway:
        model = "chaos:text=5,seed=670"
        body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}
        path = STREAM.format(model)
        with httpx2.Client(base_url=gateway.url, timeout=10) as http:
            ways = [
                http.post(path, json=body, headers={"x-goog-api-key": "gw-key-0123456789"}),
                http.post(path + "&key=gw-key-0123456789", json=body),
                http.post(path, json=body, headers={"authorization": "Bearer gw-key-0123456789"}),
            ]
            wrong = http.post(path, json=body, headers={"x-goog-api-key": "nope"})
        assert [r.status_code for r in ways] == [200, 200, 200]
        assert wrong.status_code == 401
        assert wrong.json()["error"]["status"] == "UNAUTHENTICATED"
    for request in chaos.requests_for(model):
        assert "key=" not in request.query  # the gateway key stays at the gateway


def test_count_tokens_and_the_model_list_pass_through(
    recovering: RunningGateway, sdk: genai.Client
) -> None:
    counted = sdk.models.count_tokens(model="chaos:text=5", contents="Tell me.")
    assert counted.total_tokens is not None and counted.total_tokens > 0
    names = [m.name for m in sdk.models.list()]
    assert "models/gemini-2.5-flash" in names


def test_resume_by_run_id_gives_exactly_the_rest(recovering: RunningGateway) -> None:
    model = "chaos:text=40,seed=680,pace_ms=20"
    body = {"contents": [{"role": "user", "parts": [{"text": "Tell me."}]}]}
    with httpx2.Client(base_url=recovering.url, timeout=15) as http:
        key = {"x-goog-api-key": "k"}
        run_id, head, read = first_raw_events(http, STREAM.format(model), body, key, 8)
        resume = key | {"x-run-id": run_id, "x-resume-from": str(read)}
        rest = http.post(STREAM.format(model), json=body, headers=resume).content
        stranger = http.post(
            STREAM.format(model), json=body, headers=resume | {"x-goog-api-key": "other"}
        )
    chunks, error = events(head + rest)
    assert error is None
    check_contract(chunks)
    assert text(chunks) == expected_answer(model).text
    assert stranger.status_code == 404 and stranger.json()["error"]["status"] == "NOT_FOUND"


def test_a_gateway_error_on_the_gemini_door_is_google_shaped(recovering: RunningGateway) -> None:
    with httpx2.Client(base_url=recovering.url, timeout=10) as http:
        no_sse = http.post("/v1beta/models/chaos:streamGenerateContent", json={"contents": []})
        bad_json = http.post(STREAM.format("chaos"), content=b"{", headers={"x-goog-api-key": "k"})
        many = http.post(
            STREAM.format("chaos"),
            json={"contents": [], "generationConfig": {"candidateCount": 2}},
        )
    for response in (no_sse, bad_json, many):
        assert response.status_code == 400
        assert response.json()["error"]["status"] == "INVALID_ARGUMENT"

"""The Gemini dialect (``gemini.py``, ``gemini_stream.py``), checked by the google-genai SDK
as its client and by its bytes: both doors, every fault, continuation, and the thought
signatures it issues and checks as Gemini 3 does."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials

from gateway.chaos import ChaosUpstream, expected_answer, gemini
from gateway.chaos.answer import script_for
from gateway.chaos.clouds import VERTEX_TOKEN
from gateway.chaos.spec import parse_spec
from gateway.recovery.classify import is_transient_error
from gateway.upstream.continuation import ANCHOR_INSTRUCTION
from tests.chaos.helpers import first_deltas

KEY = "chaos-gemini-key"
USER = {"role": "user", "parts": [{"text": "Say something."}]}
THOUGHTS = {"thinkingConfig": {"includeThoughts": True}}
TRANSPORT_ERRORS = (httpx2.TransportError,)


def root(chaos: ChaosUpstream) -> str:
    return chaos.base_url.removesuffix("/v1")


def developer_client(chaos: ChaosUpstream, version: str = "v1beta") -> genai.Client:
    options = types.HttpOptions(base_url=root(chaos), api_version=version)
    return genai.Client(api_key=KEY, http_options=options)


def vertex_client(chaos: ChaosUpstream, token: str = VERTEX_TOKEN) -> genai.Client:
    return genai.Client(
        vertexai=True,
        project="chaos-project",
        location="us-central1",
        credentials=Credentials(token=token),  # type: ignore[no-untyped-call]
        http_options=types.HttpOptions(base_url=root(chaos)),
    )


@pytest.fixture
def sdk(chaos: ChaosUpstream) -> genai.Client:
    return developer_client(chaos)


@pytest.fixture
def raw(chaos: ChaosUpstream) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=root(chaos), timeout=10) as client:
        yield client


def thinking() -> types.GenerateContentConfig:
    return types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))


# --- reading a stream as bytes -------------------------------------------------------------


class Read:
    def __init__(self, status: int, body: bytes, error: Exception | None) -> None:
        self.status, self.body, self.error = status, body, error

    def datas(self) -> list[str]:
        """The data of each ``data:`` event (CRLF or LF), in order."""
        text = self.body.decode()
        events = text.replace("\r\n", "\n").split("\n\n")
        return [e.removeprefix("data: ") for e in events if e.startswith("data: ")]

    def chunks(self) -> list[dict[str, Any]]:
        """Each event's GenerateContentResponse, validated by the SDK's type."""
        parsed = [json.loads(data) for data in self.datas()]
        for chunk in parsed:
            if "error" not in chunk:
                types.GenerateContentResponse.model_validate(chunk)
        return parsed


def post(
    client: httpx2.Client,
    spec: str,
    contents: list[Any] | None = None,
    *,
    method: str = "streamGenerateContent",
    prefix: str = "/v1beta/models/",
    headers: dict[str, str] | None = None,
    **body: Any,
) -> Read:
    url = f"{prefix}{quote(spec, safe=':,=')}:{method}"
    payload = {"contents": [USER] if contents is None else contents, **body}
    sent = {"x-goog-api-key": KEY, **(headers or {})}
    params = {"alt": "sse"} if method == "streamGenerateContent" else {}
    pieces: list[bytes] = []
    error: Exception | None = None
    with client.stream("POST", url, json=payload, headers=sent, params=params) as response:
        try:
            for piece in response.iter_raw():
                pieces.append(piece)
        except httpx2.TransportError as exc:
            error = exc
    return Read(response.status_code, b"".join(pieces), error)


def parts(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for c in chunks if "candidates" in c for p in c["candidates"][0]["content"]["parts"]]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(p["text"] for p in parts(chunks) if "text" in p and not p.get("thought"))


def google_error(body: bytes) -> dict[str, Any]:
    document = json.loads(body)
    assert set(document) == {"error"}
    assert {"code", "message", "status"} <= set(document["error"])
    error: dict[str, Any] = document["error"]
    return error


# --- a clean stream ------------------------------------------------------------------------

SPECS = [
    "chaos",
    "chaos:text=6,reasoning=3,tools=2,seed=5",
    "chaos:text=0,tools=1",
    "chaos:text=0,reasoning=2",
    "chaos:text=0",
    "chaos:text=9,reasoning=2,tools=1,split=7",
    "chaos:text=5,reasoning=1,pace_ms=1",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("door", gemini.DOORS)
def test_sdk_streams_the_expected_answer(chaos: ChaosUpstream, spec: str, door: str) -> None:
    client = developer_client(chaos) if door == gemini.DEVELOPER else vertex_client(chaos)
    chunks = list(
        client.models.generate_content_stream(model=spec, contents="x", config=thinking())
    )
    answer = expected_answer(spec)
    said = [part for chunk in chunks for part in chunk.candidates[0].content.parts]  # type: ignore[index,union-attr]
    assert all(chunk.candidates[0].content.parts for chunk in chunks)  # type: ignore[index,union-attr]
    thought = "".join(p.text or "" for p in said if p.thought)
    text = "".join(p.text or "" for p in said if not p.thought)
    calls = [p.function_call for p in said if p.function_call]
    assert (thought, text) == (answer.reasoning, answer.text)
    assert [(c.name, c.args) for c in calls] == [
        (call.name, json.loads(call.arguments)) for call in answer.tool_calls
    ]
    finishes = [chunk.candidates[0].finish_reason for chunk in chunks]  # type: ignore[index]
    assert finishes == [None] * (len(chunks) - 1) + [types.FinishReason.STOP]
    assert len({chunk.response_id for chunk in chunks}) == 1
    assert {chunk.model_version for chunk in chunks} == {"gemini-2.5-flash"}
    usage = chunks[-1].usage_metadata
    assert usage is not None and usage.prompt_token_count == 11
    script = script_for(parse_spec(spec))
    assert usage.candidates_token_count == len(script.text_deltas) + len(script.tool_calls)
    assert usage.thoughts_token_count == (len(script.reasoning_deltas) or None)
    assert usage.total_token_count == 11 + len(said) - (not text and not calls)
    # The signature: on the first call, else on the last (maybe empty) text part, only there.
    signed = [index for index, p in enumerate(said) if p.thought_signature]
    first_call = [index for index, p in enumerate(said) if p.function_call][:1]
    assert signed == (first_call or [len(said) - 1])
    part = said[signed[0]]
    dumped = part.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert gemini.signature_valid(door, dumped)
    other = gemini.VERTEX if door == gemini.DEVELOPER else gemini.DEVELOPER
    assert not gemini.signature_valid(other, dumped)
    [recorded] = [r for r in chaos.requests if r.body and r.body.get("model") == spec][-1:]
    assert recorded.dialect == door
    assert recorded.answered_text == answer.text


def test_the_bytes_of_a_stream(raw: httpx2.Client) -> None:
    spec = "chaos:text=3,reasoning=2,tools=2"
    read = post(raw, spec, generationConfig=THOUGHTS)
    assert read.status == 200 and read.error is None
    chunks = read.chunks()
    # Google's framing: one compact line per event, CRLF, a blank line after each.
    assert read.body.startswith(b'data: {"candidates":[{"content":{"parts":[{"text":')
    assert read.body.endswith(b"}\r\n\r\n")
    assert read.body.count(b"\r\n\r\n") == len(chunks) == 2 + 3 + 2
    assert b"\n" not in read.body.replace(b"\r\n", b"")
    identity = chunks[0]["responseId"]
    script = script_for(parse_spec(spec))
    expected_parts: list[dict[str, Any]] = [
        *({"text": delta, "thought": True} for delta in script.reasoning_deltas),
        *({"text": delta} for delta in script.text_deltas),
        *(
            {"functionCall": {"name": c.name, "args": json.loads(c.arguments)}}
            for c in script.tool_calls
        ),
    ]
    signature = chunks[5]["candidates"][0]["content"]["parts"][0].pop("thoughtSignature")
    assert gemini.signature_valid(
        gemini.DEVELOPER, expected_parts[5] | {"thoughtSignature": signature}
    )
    running = {"promptTokenCount": 11, "totalTokenCount": 11}
    for index, (chunk, part) in enumerate(zip(chunks, expected_parts, strict=True)):
        candidate: dict[str, Any] = {"content": {"parts": [part], "role": "model"}, "index": 0}
        usage: dict[str, Any] = running
        if index == len(chunks) - 1:
            candidate = {"content": candidate["content"], "finishReason": "STOP", "index": 0}
            usage = {
                "promptTokenCount": 11,
                "candidatesTokenCount": 5,
                "totalTokenCount": 18,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 11}],
                "thoughtsTokenCount": 2,
            }
        assert chunk == {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": "gemini-2.5-flash",
            "responseId": identity,
        }
    assert list(chunks[-1]["candidates"][0]) == ["content", "finishReason", "index"]


def test_a_text_answer_is_signed_on_its_last_text_part(raw: httpx2.Client) -> None:
    spec = "chaos:text=4"
    chunks = post(raw, spec).chunks()
    said = parts(chunks)
    assert [list(part) for part in said] == [["text"]] * 3 + [["text", "thoughtSignature"]]
    assert gemini.signature_valid(gemini.DEVELOPER, said[-1])
    assert not gemini.signature_valid(gemini.DEVELOPER, said[-1] | {"text": "other"})
    assert "finishReason" in chunks[-1]["candidates"][0]
    # New per response.
    again = parts(post(raw, spec).chunks())[-1]
    assert again["text"] == said[-1]["text"]
    assert again["thoughtSignature"] != said[-1]["thoughtSignature"]


@pytest.mark.parametrize(
    "config",
    [
        {"generationConfig": {"thinkingConfig": {"includeThoughts": True}}},
        {"generationConfig": {"thinkingConfig": {"include_thoughts": True}}},
        {"generation_config": {"thinking_config": {"include_thoughts": True}}},
    ],
)
def test_thoughts_only_when_asked_either_spelling(
    raw: httpx2.Client, config: dict[str, Any]
) -> None:
    spec = "chaos:text=2,reasoning=3"
    asked = parts(post(raw, spec, **config).chunks())
    assert [p.get("thought", False) for p in asked] == [True] * 3 + [False] * 2
    unasked = post(raw, spec).chunks()
    assert [p.get("thought", False) for p in parts(unasked)] == [False] * 2
    assert unasked[-1]["usageMetadata"]["thoughtsTokenCount"] == 3


@pytest.mark.parametrize("door", gemini.DOORS)
def test_generate_content_merges_the_parts(chaos: ChaosUpstream, door: str) -> None:
    client = developer_client(chaos) if door == gemini.DEVELOPER else vertex_client(chaos)
    spec = "chaos:text=6,reasoning=3,tools=2"
    response = client.models.generate_content(model=spec, contents="x", config=thinking())
    answer = expected_answer(spec)
    candidate = response.candidates[0]  # type: ignore[index]
    assert candidate.finish_reason == types.FinishReason.STOP
    thought, text, *calls = candidate.content.parts  # type: ignore[union-attr,misc]
    assert (thought.thought, thought.text) == (True, answer.reasoning)
    assert (text.thought, text.text, text.thought_signature) == (None, answer.text, None)
    assert [(c.function_call.name, c.function_call.args) for c in calls] == [  # type: ignore[union-attr]
        (call.name, json.loads(call.arguments)) for call in answer.tool_calls
    ]
    assert calls[0].thought_signature and not calls[1].thought_signature
    dumped = calls[0].model_dump(mode="json", by_alias=True, exclude_none=True)
    assert gemini.signature_valid(door, dumped)
    plain = client.models.generate_content(model="chaos:text=3", contents="x")
    [only] = plain.candidates[0].content.parts  # type: ignore[index,union-attr,misc]
    assert only.text == expected_answer("chaos:text=3").text and only.thought_signature


def test_count_tokens_and_models(sdk: genai.Client, raw: httpx2.Client) -> None:
    assert sdk.models.count_tokens(model="chaos", contents="x").total_tokens == 11
    assert [m.name for m in sdk.models.list()][:1] == ["models/gemini-2.5-flash"]
    assert sdk.models.get(model="gemini-3-pro-preview").name == "models/gemini-3-pro-preview"
    with pytest.raises(errors.ClientError, match="NOT_FOUND"):
        sdk.models.get(model="gemini-0")
    # GET /v1/models is Gemini's only with a Gemini key; else the OpenAI list.
    assert "models" in raw.get("/v1/models", params={"key": KEY}).json()
    assert "data" in raw.get("/v1/models").json()


def test_the_developer_door_wants_a_key(raw: httpx2.Client) -> None:
    url = "/v1beta/models/chaos:generateContent"
    response = raw.post(url, json={"contents": [USER]})
    assert response.status_code == 403
    assert google_error(response.content)["status"] == "PERMISSION_DENIED"
    response = raw.post(
        url, json={"contents": [USER]}, headers={"x-goog-api-key": gemini.INVALID_KEY}
    )
    assert response.status_code == 400
    assert (
        google_error(response.content)["message"]
        == "API key not valid. Please pass a valid API key."
    )
    assert raw.post(url, json={"contents": [USER]}, params={"key": KEY}).status_code == 200


def test_the_vertex_door_checks_the_token(chaos: ChaosUpstream) -> None:
    client = vertex_client(chaos, token="ya29.not-issued")
    with pytest.raises(errors.ClientError) as raised:
        client.models.generate_content(model="chaos:text=2", contents="x")
    assert raised.value.code == 401 and raised.value.status == "UNAUTHENTICATED"


def test_spec_in_the_header_and_a_real_model_name(raw: httpx2.Client) -> None:
    read = post(raw, "gemini-2.5-pro", headers={"x-chaos": "chaos:text=3"})
    chunks = read.chunks()
    assert text_of(chunks) == expected_answer("chaos:text=3").text
    assert chunks[0]["modelVersion"] == "gemini-2.5-pro"


def test_a_bad_spec_is_invalid_argument(raw: httpx2.Client) -> None:
    read = post(raw, "chaos:txt=3")
    assert read.status == 400
    error = google_error(read.body)
    assert error["status"] == "INVALID_ARGUMENT" and "unknown key 'txt'" in error["message"]


# --- faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("at", [0, 1, 7, 20])
def test_reset_after_exactly_at_deltas(raw: httpx2.Client, at: int) -> None:
    spec = f"chaos:fault=reset,at={at}"
    read = post(raw, spec)
    assert isinstance(read.error, httpx2.ReadError | httpx2.RemoteProtocolError)
    chunks = read.chunks()
    assert len(chunks) == at
    assert text_of(chunks) == first_deltas(spec, at)
    assert all("finishReason" not in chunk["candidates"][0] for chunk in chunks)
    assert all("thoughtSignature" not in part for part in parts(chunks))


def test_at_counts_thoughts_text_and_calls(raw: httpx2.Client) -> None:
    spec = "chaos:reasoning=2,text=2,tools=2,fault=close"
    for at, kinds in [
        (1, ["thought"]),
        (3, ["thought", "thought", "text"]),
        (5, ["thought", "thought", "text", "text", "functionCall"]),
    ]:
        read = post(raw, f"{spec},at={at}", generationConfig=THOUGHTS)
        said = parts(read.chunks())
        got = [
            "thought" if p.get("thought") else "text" if "text" in p else "functionCall"
            for p in said
        ]
        assert got == kinds
    # Without includeThoughts the thoughts are not sent, so not counted.
    said = parts(post(raw, f"{spec},at=3").chunks())
    assert ["functionCall" in p for p in said] == [False, False, True]


def test_close_is_an_incomplete_chunked_read(raw: httpx2.Client) -> None:
    read = post(raw, "chaos:fault=close,at=4")
    assert isinstance(read.error, httpx2.RemoteProtocolError)
    assert text_of(read.chunks()) == first_deltas("chaos", 4)


def test_stall_is_a_read_timeout(chaos: ChaosUpstream) -> None:
    timeout = httpx2.Timeout(10, read=0.3)
    with httpx2.Client(base_url=root(chaos), timeout=timeout) as client:
        started = time.monotonic()
        read = post(client, "chaos:fault=stall,at=3")
    assert isinstance(read.error, httpx2.ReadTimeout)
    assert time.monotonic() - started < 5
    assert text_of(read.chunks()) == first_deltas("chaos", 3)


OVERLOADED = (
    b'{\n  "error": {\n    "code": 503,\n'
    b'    "message": "The model is overloaded. Please try again later.",\n'
    b'    "status": "UNAVAILABLE"\n  }\n}\n'
)
RAW_ERRORS = [
    ("error", OVERLOADED, True),
    (
        "error_fatal",
        b'{\n  "error": {\n    "code": 400,\n'
        b'    "message": "Request contains an invalid argument.",\n'
        b'    "status": "INVALID_ARGUMENT"\n  }\n}\n',
        False,
    ),
    (
        "finish_error",
        b'{\n  "error": {\n    "code": 500,\n    "message": "An internal error has occurred. '
        b"Please retry or report in https://developers.generativeai.google/guide/"
        b'troubleshooting",\n    "status": "INTERNAL"\n  }\n}\n',
        True,
    ),
]


@pytest.mark.parametrize(("fault", "body", "transient"), RAW_ERRORS)
def test_raw_error_object_after_the_events(
    raw: httpx2.Client, fault: str, body: bytes, transient: bool
) -> None:
    read = post(raw, f"chaos:fault={fault},at=5")
    assert read.status == 200 and read.error is None
    assert read.body.endswith(b"}\r\n\r\n" + body)
    chunks = read.chunks()
    assert len(chunks) == 5 and text_of(chunks) == first_deltas("chaos", 5)
    error = google_error(body)
    assert is_transient_error(error) is transient


@pytest.mark.parametrize("fault", ["error_data", "error_done"])
def test_error_as_a_data_event(raw: httpx2.Client, fault: str) -> None:
    read = post(raw, f"chaos:fault={fault},at=5")
    assert read.error is None
    assert read.body.endswith(
        b'\r\n\r\ndata: {"error":{"code":503,"message":"The model is overloaded. '
        b'Please try again later.","status":"UNAVAILABLE"}}\r\n\r\n'
    )
    chunks = read.chunks()
    assert text_of(chunks[:-1]) == first_deltas("chaos", 5)
    assert chunks[-1]["error"]["status"] == "UNAVAILABLE"


@pytest.mark.parametrize(
    ("fault", "raised", "code"),
    [
        ("error", errors.ServerError, 503),
        ("error_data", errors.ServerError, 503),
        ("finish_error", errors.ServerError, 500),
        ("error_fatal", errors.ClientError, 400),
        ("http_429", errors.ClientError, 429),
        ("http_503", errors.ServerError, 503),
        ("http_400", errors.ClientError, 400),
    ],
)
def test_the_sdk_raises_on_errors(
    sdk: genai.Client, fault: str, raised: type[errors.APIError], code: int
) -> None:
    seen: list[str] = []
    with pytest.raises(raised) as caught:
        for chunk in sdk.models.generate_content_stream(
            model=f"chaos:text=10,fault={fault},at=4", contents="x"
        ):
            seen.append(chunk.text or "")
    assert caught.value.code == code
    assert "".join(seen) == (
        first_deltas("chaos:text=10", 4) if fault.startswith(("error", "finish")) else ""
    )


@pytest.mark.parametrize("fault", ["reset", "close"])
def test_the_sdk_raises_on_a_broken_body(sdk: genai.Client, fault: str) -> None:
    with pytest.raises(TRANSPORT_ERRORS):
        for _ in sdk.models.generate_content_stream(
            model=f"chaos:fault={fault},at=3", contents="x"
        ):
            pass


def test_no_finish_looks_like_a_short_clean_answer_to_the_sdk(sdk: genai.Client) -> None:
    spec = "chaos:text=8,fault=no_finish,at=5"
    chunks = list(sdk.models.generate_content_stream(model=spec, contents="x"))
    assert "".join(chunk.text or "" for chunk in chunks) == first_deltas(spec, 5)
    assert all(chunk.candidates[0].finish_reason is None for chunk in chunks)  # type: ignore[index]


def test_no_finish_after_the_last_delta_sends_it_without_its_finish(raw: httpx2.Client) -> None:
    read = post(raw, "chaos:text=3,fault=no_finish,at=3")
    chunks = read.chunks()
    assert text_of(chunks) == expected_answer("chaos:text=3").text
    assert "finishReason" not in chunks[-1]["candidates"][0]
    assert chunks[-1]["usageMetadata"] == {"promptTokenCount": 11, "totalTokenCount": 11}
    assert all("thoughtSignature" not in part for part in parts(chunks))


def test_malformed_event_then_the_rest(raw: httpx2.Client, sdk: genai.Client) -> None:
    read = post(raw, "chaos:fault=malformed,at=2")
    datas = read.datas()
    assert datas[2] == '{"candidates": ['
    rest = [json.loads(data) for index, data in enumerate(datas) if index != 2]
    assert text_of(rest) == expected_answer("chaos").text
    assert "finishReason" in rest[-1]["candidates"][0]
    with pytest.raises(errors.UnknownApiResponseError):
        list(
            sdk.models.generate_content_stream(
                model="chaos:fault=malformed,at=2,seed=1", contents="x"
            )
        )


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        ("http_400", 400, "INVALID_ARGUMENT"),
        ("http_400_context", 400, "INVALID_ARGUMENT"),
        ("http_401", 401, "UNAUTHENTICATED"),
        ("http_404", 404, "NOT_FOUND"),
        ("http_429", 429, "RESOURCE_EXHAUSTED"),
        ("http_500", 500, "INTERNAL"),
        ("http_503", 503, "UNAVAILABLE"),
    ],
)
def test_http_faults_in_googles_shape(
    raw: httpx2.Client, fault: str, code: int, status: str
) -> None:
    read = post(raw, f"chaos:fault={fault}")
    assert read.status == code
    error = google_error(read.body)
    assert (error["code"], error["status"]) == (code, status)
    assert read.body.startswith(b'{\n  "error": {\n    "code": ')


def test_http_429_retry_says_its_delay(raw: httpx2.Client) -> None:
    read = post(raw, "chaos:fault=http_429_retry,retry_after=7")
    assert read.status == 429
    [detail] = google_error(read.body)["details"]
    assert detail == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}


def test_times_faults_only_the_first_requests(raw: httpx2.Client) -> None:
    spec = "chaos:text=6,fault=reset,at=2,times=1,seed=77"
    assert post(raw, spec).error is not None
    clean = post(raw, spec)
    assert clean.error is None and text_of(clean.chunks()) == expected_answer(spec).text


def test_generate_content_under_faults(raw: httpx2.Client) -> None:
    read = post(raw, "chaos:fault=error,at=2", method="generateContent")
    assert read.status == 503 and read.body == OVERLOADED
    read = post(raw, "chaos:fault=reset,at=2", method="generateContent")
    assert read.error is not None
    read = post(raw, "chaos:fault=no_finish,at=2", method="generateContent")
    assert read.status == 200


def test_error_data_is_the_error_fault_in_the_other_dialects(raw: httpx2.Client) -> None:
    body = {
        "model": "chaos:fault=error_data,at=2",
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    response = raw.post("/v1/chat/completions", json=body)
    assert b'"upstream overloaded"' in response.content


# --- continuation -------------------------------------------------------------------------


def model_turn(text: str) -> dict[str, Any]:
    return {"role": "model", "parts": [{"text": text}]}


@pytest.mark.parametrize("cut", [3, 10, 31])  # on a delta boundary, or inside one
def test_a_trailing_model_turn_is_continued(
    chaos: ChaosUpstream, raw: httpx2.Client, cut: int
) -> None:
    spec = f"chaos:text=12,seed={300 + cut}"
    text = expected_answer(spec).text
    prefix = text[:cut] if cut != 3 else first_deltas(spec, 3)
    read = post(raw, spec, [USER, model_turn(prefix)])
    assert read.status == 200
    assert prefix + text_of(read.chunks()) == text
    [recorded] = chaos.requests_for(spec)
    assert (recorded.prefix, recorded.echo, recorded.answered_text) == (
        prefix,
        "",
        text[len(prefix) :],
    )
    assert recorded.dialect == gemini.DEVELOPER and recorded.attempt == 0


def test_the_sdk_continues_a_prefill(sdk: genai.Client) -> None:
    spec = "chaos:text=10,seed=41"
    text = expected_answer(spec).text
    contents = [
        types.Content(role="user", parts=[types.Part(text="x")]),
        types.Content(role="model", parts=[types.Part(text=text[:17])]),
    ]
    chunks = list(sdk.models.generate_content_stream(model=spec, contents=contents))
    assert text[:17] + "".join(chunk.text or "" for chunk in chunks) == text


def test_the_sdks_history_of_model_contents_is_one_prefill(raw: httpx2.Client) -> None:
    spec = "chaos:text=8,seed=42"
    deltas = script_for(parse_spec(spec)).text_deltas
    history = [USER, *(model_turn(delta) for delta in deltas[:4])]
    assert "".join(deltas[:4]) + text_of(post(raw, spec, history).chunks()) == "".join(deltas)


REFUSED = (
    b'{\n  "error": {\n    "code": 400,\n    "message": "Requests ending with a model turn are '
    b'not supported for this model.",\n    "status": "INVALID_ARGUMENT"\n  }\n}\n'
)


def test_gemini_3_refuses_a_prefill(raw: httpx2.Client, sdk: genai.Client) -> None:
    spec = "chaos:text=6,prefill=0"
    prefix = first_deltas(spec, 2)
    read = post(raw, spec, [USER, model_turn(prefix)])
    assert (read.status, read.body) == (400, REFUSED)
    # A real Gemini 3 name, the spec in x-chaos.
    read = post(
        raw, "gemini-3-pro-preview", [USER, model_turn(prefix)], headers={"x-chaos": "chaos:text=6"}
    )
    assert (read.status, read.body) == (400, REFUSED)
    assert (
        post(
            raw, "gemini-2.5-pro", [USER, model_turn(prefix)], headers={"x-chaos": "chaos:text=6"}
        ).status
        == 200
    )
    with pytest.raises(errors.ClientError, match="model turn are not supported"):
        sdk.models.generate_content(
            model=spec,
            contents=[
                types.Content(role="user", parts=[types.Part(text="x")]),
                types.Content(role="model", parts=[types.Part(text=prefix)]),
            ],
        )


@pytest.mark.parametrize("anchored", [True, False])
def test_prompt_mode_continues_too(
    chaos: ChaosUpstream, raw: httpx2.Client, anchored: bool
) -> None:
    spec = f"chaos:text=10,prefill=0,seed={50 + anchored}"
    text = expected_answer(spec).text
    prefix = text[:23]
    prompt = "Continue exactly where you left off."
    tail = prefix[-8:]
    if anchored:
        prompt += ANCHOR_INSTRUCTION.format(tail=tail)
    contents = [USER, model_turn(prefix), {"role": "user", "parts": [{"text": prompt}]}]
    said = text_of(post(raw, spec, contents).chunks())
    assert said == (tail if anchored else "") + text[23:]
    [recorded] = chaos.requests_for(spec)
    assert (recorded.prefix, recorded.echo) == (prefix, tail if anchored else "")


def test_a_reset_then_a_continuation_says_the_whole_answer(raw: httpx2.Client) -> None:
    spec = "chaos:text=12,reasoning=2,fault=reset,at=7,times=1,seed=60"
    first = post(raw, spec, generationConfig=THOUGHTS)
    assert first.error is not None
    delivered = text_of(first.chunks())
    second = post(raw, spec, [USER, model_turn(delivered)], generationConfig=THOUGHTS)
    assert delivered + text_of(second.chunks()) == expected_answer(spec).text


# --- signatures checked on the next turn ------------------------------------------------------


def next_turn(call_part: dict[str, Any]) -> list[dict[str, Any]]:
    result = {"functionResponse": {"name": "tool_0", "response": {"ok": True}}}
    return [USER, {"role": "model", "parts": [call_part]}, {"role": "user", "parts": [result]}]


def first_call(raw: httpx2.Client, spec: str, prefix: str = "/v1beta/models/") -> dict[str, Any]:
    return next(p for p in parts(post(raw, spec, prefix=prefix).chunks()) if "functionCall" in p)


def test_a_function_call_without_its_signature_is_refused(raw: httpx2.Client) -> None:
    call = first_call(raw, "chaos:text=2,tools=1,seed=70")
    del call["thoughtSignature"]
    read = post(raw, "chaos:text=5,tools=1,seed=70", next_turn(call))
    assert read.status == 400
    error = google_error(read.body)
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["message"].startswith(
        "Function call is missing a thought_signature in functionCall parts."
    )
    assert "`default_api:tool_0`" in error["message"]


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda call: call | {"thoughtSignature": "c2lnbmF0dXJl"},
        lambda call: call | {"functionCall": call["functionCall"] | {"args": {}}},
        lambda call: call | {"thoughtSignature": call["thoughtSignature"][:-4]},
    ],
    ids=["foreign", "other-args", "cut"],
)
def test_a_corrupted_signature_is_refused(raw: httpx2.Client, corrupt: Any) -> None:
    call = first_call(raw, "chaos:text=2,tools=1,seed=71")
    read = post(raw, "chaos:text=5,tools=1,seed=71", next_turn(corrupt(call)))
    assert read.status == 400
    assert google_error(read.body) == {
        "code": 400,
        "message": "Corrupted thought signature.",
        "status": "INVALID_ARGUMENT",
    }


def test_a_valid_signature_or_the_dummy_is_accepted_and_answered_in_text(
    raw: httpx2.Client,
) -> None:
    spec = "chaos:text=5,tools=1,seed=72"
    call = first_call(raw, spec)
    for sent in (call, call | {"thoughtSignature": gemini.SKIP_SIGNATURE}):
        read = post(raw, spec, next_turn(sent))
        assert read.status == 200
        said = parts(read.chunks())
        assert not any("functionCall" in part for part in said)  # tool results: a text turn
        assert "".join(part["text"] for part in said) == expected_answer(spec).text


def test_vertex_refuses_a_developer_signature_and_back(
    chaos: ChaosUpstream, raw: httpx2.Client
) -> None:
    vertex = "/v1/projects/p/locations/us-central1/publishers/google/models/"
    token = {"authorization": f"Bearer {VERTEX_TOKEN}"}
    spec = "chaos:text=2,tools=1,seed=73"
    from_developer = first_call(raw, spec)
    read = post(raw, spec, next_turn(from_developer), prefix=vertex, headers=token)
    assert (
        read.status == 400 and google_error(read.body)["message"] == "Corrupted thought signature."
    )
    from_vertex = next(
        p
        for p in parts(post(raw, spec, prefix=vertex, headers=token).chunks())
        if "functionCall" in p
    )
    assert post(raw, spec, next_turn(from_vertex), prefix=vertex, headers=token).status == 200
    assert post(raw, spec, next_turn(from_vertex)).status == 400


def test_a_signature_on_a_text_part_must_be_valid_too(raw: httpx2.Client) -> None:
    spec = "chaos:text=3,seed=74"
    last = parts(post(raw, spec).chunks())[-1]
    again = [USER, {"role": "model", "parts": [last]}, USER]
    assert post(raw, spec, again).status == 200
    forged = [USER, {"role": "model", "parts": [last | {"text": "forged"}]}, USER]
    assert google_error(post(raw, spec, forged).body)["message"] == "Corrupted thought signature."


def test_a_chat_sessions_next_turn_after_a_function_call(chaos: ChaosUpstream) -> None:
    for client in (developer_client(chaos), vertex_client(chaos)):
        spec = "chaos:text=4,tools=2,seed=75"
        chat = client.chats.create(model=spec)
        said = list(chat.send_message_stream("x"))
        assert said[-1].function_calls
        result = types.Part.from_function_response(name="tool_0", response={"ok": True})
        answer = "".join(chunk.text or "" for chunk in chat.send_message_stream(result))
        assert answer == expected_answer(spec).text
        # Without the signatures the next turn is refused.
        history = chat.get_history()
        for content in history:
            for part in content.parts or []:
                part.thought_signature = None
        bare = client.chats.create(
            model=spec, history=list[types.Content | types.ContentDict](history)
        )
        with pytest.raises(errors.ClientError, match="missing a thought_signature"):
            bare.send_message(result)


def test_reset_before_the_response(raw: httpx2.Client) -> None:
    with pytest.raises(httpx2.TransportError):
        post(raw, "chaos:fault=reset_before")


@pytest.mark.parametrize(
    "wire", ["lineend=lf", "lineend=cr", "comments=1", "split=3", "pace_ms=1,split=5"]
)
def test_wire_variants_carry_the_same_chunks(raw: httpx2.Client, wire: str) -> None:
    spec = f"chaos:text=6,tools=1,{wire}"
    read = post(raw, spec)
    assert read.error is None
    if wire == "lineend=lf":
        assert b"\r" not in read.body and read.body.endswith(b"}\n\n")
    text = read.body.decode().replace("\r\n", "\n").replace("\r", "\n")
    events = [e for e in text.split("\n\n") if e.strip()]
    datas = [
        line.removeprefix("data: ")
        for e in events
        for line in e.split("\n")
        if line.startswith("data: ")
    ]
    chunks = [json.loads(data) for data in datas]
    assert text_of(chunks) == expected_answer(spec).text
    assert "finishReason" in chunks[-1]["candidates"][0]


@pytest.mark.parametrize("variance", ["rechunk=1", "sample=1"])
def test_variance_between_attempts(chaos: ChaosUpstream, raw: httpx2.Client, variance: str) -> None:
    spec = f"chaos:text=12,seed=80,{variance},fault=reset,at=4,times=1"
    delivered = text_of(post(raw, spec).chunks())
    rest = text_of(post(raw, spec, [USER, model_turn(delivered)]).chunks())
    first, second = chaos.requests_for(spec)
    assert (first.attempt, second.attempt) == (0, 1)
    assert second.prefix == delivered and second.answered_text == rest
    if variance == "rechunk=1":
        assert delivered + rest == expected_answer(spec).text

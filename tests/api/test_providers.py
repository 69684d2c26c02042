"""The same model on several providers, end to end: real sockets, the chaos upstream's
cloud dialects (Bedrock's SigV4 and event stream framing, Vertex's OAuth, Azure's
api-key and URL forms), the anthropic and openai SDKs as the gateway's clients.

Each kind relays and recovers through every fault at several points; a stream cut on
Anthropic is finished on Bedrock or on Vertex, one cut on OpenAI on Azure (streamed
and not), exactly; bad credentials give a clear error and never leak.

Credentials are found as in production: AWS's from the environment (botocore's
chain), Google's application default credentials from
``GOOGLE_APPLICATION_CREDENTIALS`` (an authorized-user file whose token endpoint is
the chaos upstream's ``/token``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.chaos.clouds import AZURE_KEY, BEDROCK_CREDENTIALS
from gateway.config.load import parse_config
from gateway.config.schema import GatewayConfig
from tests.api.test_messages import (
    ASK,
    FAULTS,
    blocks,
    check_contract,
    final,
    parse,
    text,
)
from tests.servers import FAST_RETRY, RunningGateway, running_gateway

[(KEY_ID, SECRET)] = BEDROCK_CREDENTIALS.items()
TIMEOUTS = {"connect": 2, "first_byte": 3, "idle": 0.5}


def upstreams(chaos: ChaosUpstream) -> list[dict[str, Any]]:
    root = chaos.base_url.removesuffix("/v1")
    return [
        {"name": "anthropic", "kind": "anthropic", "base_url": root},
        {
            "name": "bedrock",
            "kind": "bedrock",
            "region": "us-east-1",
            "base_url": root,
            "headers": {"x-operator": "bedrock"},
            "anthropic_betas": ["tools-2024-04-04"],
        },
        {
            "name": "vertex",
            "kind": "vertex",
            "region": "us-east5",
            "project": "chaos-project",
            "base_url": chaos.base_url,
            "headers": {"x-operator": "vertex"},
        },
        {"name": "openai", "kind": "openai", "base_url": chaos.base_url},
        {"name": "azure", "kind": "azure", "base_url": root + "/openai/v1", "api_key": AZURE_KEY},
        {
            "name": "azure-deployments",
            "kind": "azure",
            "base_url": root,
            "api_version": "2024-10-21",
            "api_key": AZURE_KEY,
        },
    ]


def config(
    chaos: ChaosUpstream,
    upstream: str,
    fallback: str | None = None,
    fallback_model: str | None = None,
    changed: dict[str, dict[str, Any]] | None = None,
    **extra: Any,
) -> GatewayConfig:
    """Every kind on the chaos upstream; one catch-all route to ``upstream``, retried
    without a wait. With ``fallback``: no retry on the primary, and a second leg on
    ``fallback`` asking for ``fallback_model`` (the same answer, without the fault).
    ``changed``: settings of some upstreams, by name."""
    route: dict[str, Any] = {"match": "*", "upstream": upstream, "retry": FAST_RETRY}
    if fallback is not None:
        route["retry"] = FAST_RETRY | {"retries": 0}
        route["fallbacks"] = [{"upstream": fallback, "model": fallback_model}]
    data = {
        "upstreams": [
            u | {"timeouts": TIMEOUTS} | (changed or {}).get(u["name"], {})
            for u in upstreams(chaos)
        ],
        "routes": [route],
        **extra,
    }
    return parse_config(data, "test config")


def service_account(token_uri: str) -> dict[str, str]:
    """A service account key file's fields, with a fresh RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {
        "type": "service_account",
        "project_id": "chaos-project",
        "private_key_id": "chaos-key-1",
        "private_key": pem,
        "client_email": "gateway@chaos-project.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }


@pytest.fixture(scope="module", autouse=True)
def cloud_credentials(
    chaos: ChaosUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """AWS keys in the environment; Google's ADC, a service account whose token endpoint
    is the chaos upstream's (google-auth sends it a signed JWT, as to Google's); nothing
    from this machine's own config."""
    adc = tmp_path_factory.mktemp("gcloud") / "adc.json"
    adc.write_text(json.dumps(service_account(chaos.base_url.removesuffix("/v1") + "/token")))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
        env.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        env.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        env.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
        env.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        yield


@pytest.fixture(scope="module")
def gateways(chaos: ChaosUpstream) -> Iterator[dict[str, RunningGateway]]:
    """A gateway per primary kind (no fallback), started once."""
    import contextlib

    with contextlib.ExitStack() as stack:
        yield {
            kind: stack.enter_context(running_gateway(config(chaos, kind)))
            for kind in ("anthropic", "bedrock", "vertex", "openai", "azure", "azure-deployments")
        }


def claude(gateway: RunningGateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="client-key", max_retries=0)


def gpt(gateway: RunningGateway) -> OpenAI:
    return OpenAI(base_url=gateway.base_url, api_key="client-key", max_retries=0)


def raw_messages(gateway: RunningGateway, model: str) -> list[dict[str, Any]]:
    body = {"model": model, "max_tokens": 1024, "messages": ASK, "stream": True}
    with httpx2.Client(base_url=gateway.url, timeout=15) as http:
        raw = http.post("/v1/messages", json=body, headers={"x-api-key": "client-key"})
    return parse(raw.content)


# -- each kind relays and recovers ------------------------------------------------------


@pytest.mark.parametrize("kind", ["bedrock", "vertex"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("at", [2, 14])
def test_a_claude_cloud_leg_recovers_through_every_fault(
    gateways: dict[str, RunningGateway], chaos: ChaosUpstream, kind: str, fault: str, at: int
) -> None:
    seed = 400 + FAULTS.index(fault) * 4 + (at == 14) * 2 + (kind == "vertex")
    model = f"chaos:text=30,seed={seed},fault={fault},at={at},times=1"
    with claude(gateways[kind]) as sdk:
        message = final(sdk, model)
    assert "".join(b.text for b in blocks(message, "text")) == expected_answer(model).text
    requests = chaos.requests_for(model)
    legs = 1 if fault == "malformed" else 2  # a malformed event is skipped, not a break
    assert len(requests) == legs and {r.dialect for r in requests} == {kind}
    assert all("model" not in r.received for r in requests)


@pytest.mark.parametrize("kind", ["bedrock", "vertex"])
def test_a_claude_cloud_leg_keeps_the_messages_contract_and_thinking(
    gateways: dict[str, RunningGateway], kind: str
) -> None:
    seed = 440 + (kind == "vertex")
    model = f"chaos:text=20,reasoning=6,tools=1,seed={seed},fault=reset,at=9,times=1"
    events = raw_messages(gateways[kind], model)
    check_contract(events)
    assert text(events) == expected_answer(model).text
    kinds = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert kinds == ["thinking", "text", "tool_use"]


@pytest.mark.parametrize("kind", ["azure", "azure-deployments"])
@pytest.mark.parametrize("fault", ["reset", "stall", "error", "close", "no_finish"])
@pytest.mark.parametrize("at", [3, 14])
def test_an_azure_leg_recovers_chat_and_responses(
    gateways: dict[str, RunningGateway], chaos: ChaosUpstream, kind: str, fault: str, at: int
) -> None:
    faults = ["reset", "stall", "error", "close", "no_finish"]
    seed = 600 + faults.index(fault) * 8 + (at == 14) * 4 + (kind == "azure") * 2
    chat_model = f"chaos:text=30,seed={seed},fault={fault},at={at},times=1"
    responses_model = f"chaos:text=30,seed={seed + 1},fault={fault},at={at},times=1"
    with gpt(gateways[kind]) as sdk:
        chunks = sdk.chat.completions.create(
            model=chat_model, messages=[{"role": "user", "content": "x"}], stream=True
        )
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        with sdk.responses.stream(model=responses_model, input="x") as events:
            response = events.get_final_response()
    assert said == expected_answer(chat_model).text
    assert response.output_text == expected_answer(responses_model).text
    # Responses on Azure is a background response (the default there): a cut connection
    # is read again (no second generation); a response that failed is continued.
    responses_requests = chaos.requests_for(responses_model)
    assert len(responses_requests) == (2 if fault == "error" else 1)
    assert all(r.body["background"] is True for r in responses_requests)
    assert len(chaos.requests_for(chat_model)) == 2
    for model in (chat_model, responses_model):
        requests = chaos.requests_for(model)
        assert {r.dialect for r in requests} == {"azure"}
        assert all(r.headers["api-key"] == AZURE_KEY for r in requests)
        assert all("authorization" not in r.headers for r in requests)


# -- mid-stream on another provider of the same model -----------------------------------


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_messages_stream_cut_on_anthropic_is_finished_on_another_cloud(
    chaos: ChaosUpstream, cloud: str, stream: bool
) -> None:
    # Anthropic overloaded mid-answer, every time: its leg is spent at once (no retry),
    # and the other cloud's leg, the same model by its own id, continues the answer.
    seed = 470 + (cloud == "vertex") * 2 + stream
    answer = f"chaos:text=40,seed={seed}"
    cut = f"{answer},fault=error,at=12"
    with running_gateway(config(chaos, "anthropic", cloud, answer)) as gateway:
        if stream:
            events = raw_messages(gateway, cut)
            check_contract(events)
            said = text(events)
            [start] = [e for e in events if e["type"] == "message_start"]
            [delta] = [e for e in events if e["type"] == "message_delta"]
            assert start["message"]["model"] == cut  # the answer's identity: its first leg's
            # Usage summed over both providers' legs: the chaos upstream bills a token a
            # delta, so 40 for the whole answer; the cut leg's are estimated (within 10%).
            assert abs(delta["usage"]["output_tokens"] - 40) <= 4
        else:
            with claude(gateway) as sdk:
                message = sdk.messages.create(model=cut, max_tokens=1024, messages=ASK)
            said = "".join(b.text for b in blocks(message, "text"))
    assert said == expected_answer(answer).text  # nothing lost, nothing repeated
    [first] = chaos.requests_for(cut)
    [continued] = chaos.requests_for(answer)
    assert first.dialect == "" and first.path == "/v1/messages"
    assert continued.dialect == cloud
    prefill = continued.received["messages"][-1]
    assert prefill["role"] == "assistant" and answer.startswith("chaos")
    assert prefill["content"] and expected_answer(answer).text.startswith(prefill["content"])


def test_thinking_and_its_signature_are_carried_to_another_cloud(chaos: ChaosUpstream) -> None:
    answer = "chaos:text=20,reasoning=4,seed=480"
    cut = f"{answer},fault=error,at=9"
    thinking = {"type": "enabled", "budget_tokens": 1024}
    with running_gateway(config(chaos, "anthropic", "bedrock", answer)) as gateway:
        with claude(gateway) as sdk:
            message = final(sdk, cut, thinking=thinking)
    assert "".join(b.text for b in blocks(message, "text")) == expected_answer(answer).text
    [continued] = chaos.requests_for(answer)
    *_, assistant, user = continued.received["messages"]
    assert user["role"] == "user"  # prompt mode: no prefill with thinking on
    signed, prefix = assistant["content"]
    assert signed["type"] == "thinking" and signed["signature"] == message.content[0].signature


@pytest.mark.parametrize("azure", ["azure", "azure-deployments"])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_stream_cut_on_openai_is_finished_on_azure(
    chaos: ChaosUpstream, azure: str, stream: bool
) -> None:
    seed = 490 + (azure == "azure") * 2 + stream
    chat_answer, responses_answer = f"chaos:text=40,seed={seed}", f"chaos:text=40,seed={seed + 10}"
    with (
        running_gateway(config(chaos, "openai", azure, chat_answer)) as chat_gateway,
        running_gateway(config(chaos, "openai", azure, responses_answer)) as responses_gateway,
        gpt(chat_gateway) as chat_sdk,
        gpt(responses_gateway) as responses_sdk,
    ):
        chat_cut, responses_cut = (
            f"{chat_answer},fault=reset,at=12",
            f"{responses_answer},fault=reset,at=12",
        )
        asked: Any = [{"role": "user", "content": "x"}]
        if stream:
            chunks = chat_sdk.chat.completions.create(model=chat_cut, messages=asked, stream=True)
            chat_said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            with responses_sdk.responses.stream(model=responses_cut, input="x") as events:
                responses_said = events.get_final_response().output_text
        else:
            completion = chat_sdk.chat.completions.create(model=chat_cut, messages=asked)
            chat_said = completion.choices[0].message.content or ""
            responses_said = responses_sdk.responses.create(
                model=responses_cut, input="x"
            ).output_text
    assert chat_said == expected_answer(chat_answer).text
    assert responses_said == expected_answer(responses_answer).text
    for cut, answer in ((chat_cut, chat_answer), (responses_cut, responses_answer)):
        [first] = chaos.requests_for(cut)
        [continued] = chaos.requests_for(answer)
        assert first.dialect == "" and continued.dialect == "azure"
        assert continued.headers["api-key"] == AZURE_KEY


def test_a_refused_provider_is_skipped_for_another_cloud_before_the_first_byte(
    chaos: ChaosUpstream,
) -> None:
    answer = "chaos:text=20,seed=500"
    with running_gateway(config(chaos, "anthropic", "vertex", answer)) as gateway:
        with claude(gateway) as sdk:
            message = final(sdk, f"{answer},fault=http_529")
    assert message.content[0].text == expected_answer(answer).text


# -- credentials --------------------------------------------------------------------------


def test_a_wrong_aws_secret_is_a_clear_403_that_names_no_credential(
    chaos: ChaosUpstream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-access-key-9931")
    with (
        caplog.at_level(logging.DEBUG),
        running_gateway(config(chaos, "bedrock")) as gateway,
        httpx2.Client(base_url=gateway.url, timeout=10) as http,
    ):
        response = http.post(
            "/v1/messages",
            json={"model": "chaos:text=3", "max_tokens": 10, "messages": ASK},
            headers={"x-api-key": "client-key-7713"},
        )
    assert response.status_code == 403
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "permission_error"
    # In the gateway's words: AWS's own quote the canonical request, session token and all.
    assert "(InvalidSignatureException)" in error["error"]["message"]
    assert "canonical" not in response.text.lower()
    shown = response.text + str(response.headers) + caplog.text
    for secret in ("wrong-secret-access-key-9931", SECRET, "client-key-7713"):
        assert secret not in shown


def test_no_aws_credentials_is_a_clear_502(
    chaos: ChaosUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with running_gateway(config(chaos, "bedrock")) as gateway, claude(gateway) as sdk:
        with pytest.raises(anthropic.InternalServerError, match="found no AWS credentials"):
            sdk.messages.create(model="chaos:text=3", max_tokens=10, messages=ASK)


def test_the_client_credential_never_reaches_a_cloud(
    gateways: dict[str, RunningGateway], chaos: ChaosUpstream
) -> None:
    # Nor what would speak for the gateway's identity there; the operator's headers do go.
    model = "chaos:text=3,seed=501"
    speaking = {
        "x-goog-user-project": "someone-elses-project",
        "x-amz-security-token": "client-token",
        "anthropic-beta": "tools-2024-04-04,oauth-2025-04-20",
    }
    for kind in ("bedrock", "vertex"):
        with claude(gateways[kind]) as sdk:
            sdk.messages.create(model=model, max_tokens=10, messages=ASK, extra_headers=speaking)
    bedrock, vertex = chaos.requests_for(model)
    for request in (bedrock, vertex):
        assert "x-api-key" not in request.headers and "anthropic-version" not in request.headers
        assert "client-key" not in str(request.headers)
        assert "x-goog-user-project" not in request.headers
        assert request.headers.get("x-amz-security-token") != "client-token"
        assert request.headers["x-operator"] == request.dialect
    # Bedrock takes betas in the body, only the ones it is configured to; Vertex, as the
    # SDK's AnthropicVertex sends them, in the header.
    assert bedrock.received["anthropic_beta"] == ["tools-2024-04-04"]
    assert "anthropic-beta" not in bedrock.headers
    assert vertex.headers["anthropic-beta"] == "tools-2024-04-04,oauth-2025-04-20"
    assert "anthropic_beta" not in vertex.received


def test_a_vertex_token_is_fetched_once_and_refreshed_before_it_expires(
    chaos: ChaosUpstream,
) -> None:
    tokens = chaos.tokens
    with running_gateway(config(chaos, "vertex")) as gateway, claude(gateway) as sdk:
        tokens.lifetime, before = 3600, tokens.requests
        for _ in range(3):
            sdk.messages.create(model="chaos:text=3,seed=502", max_tokens=10, messages=ASK)
        assert tokens.requests == before + 1  # one token for the three
    with running_gateway(config(chaos, "vertex")) as gateway, claude(gateway) as sdk:
        # Tokens that expire within google-auth's refresh margin (3 min 45 s): each
        # request gets a new one before it goes, never an expiring one.
        tokens.lifetime, before = 200, tokens.requests
        for _ in range(3):
            sdk.messages.create(model="chaos:text=3,seed=503", max_tokens=10, messages=ASK)
        assert tokens.requests == before + 3
    tokens.lifetime = 3600


def test_vertex_credentials_that_cannot_be_used_are_a_clear_502(
    chaos: ChaosUpstream, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "adc.json"
    broken.write_text(json.dumps(service_account("http://127.0.0.1:9/token")))  # nothing there
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(broken))
    with running_gateway(config(chaos, "vertex")) as gateway, claude(gateway) as sdk:
        with pytest.raises(anthropic.InternalServerError, match="Google access token") as raised:
            sdk.messages.create(model="chaos:text=3", max_tokens=10, messages=ASK)
    assert "PRIVATE KEY" not in str(raised.value)


def test_pass_through_paths_are_not_sent_to_a_clouds_messages_door(
    gateways: dict[str, RunningGateway], chaos: ChaosUpstream
) -> None:
    seen = len(chaos.requests)
    with httpx2.Client(base_url=gateways["bedrock"].url, timeout=10) as http:
        counted = http.post(
            "/v1/messages/count_tokens",
            json={"model": "chaos:text=3", "messages": ASK},
            headers={"x-api-key": "client-key", "anthropic-version": "2023-06-01"},
        )
    assert counted.status_code == 404
    error = counted.json()["error"]
    assert (
        "kind bedrock" in error["message"] and "POST /v1/messages/count_tokens" in error["message"]
    )
    assert len(chaos.requests) == seen  # nothing went upstream


def test_an_aws_profile_that_does_not_exist_is_a_clear_502(chaos: ChaosUpstream) -> None:
    profile = {"bedrock": {"aws_profile": "no-such-profile"}}
    with (
        running_gateway(config(chaos, "bedrock", changed=profile)) as gateway,
        claude(gateway) as sdk,
    ):
        with pytest.raises(anthropic.InternalServerError, match="ProfileNotFound"):
            sdk.messages.create(model="chaos:text=3", max_tokens=10, messages=ASK)


def test_bedrock_exceptions_are_read_as_the_anthropic_errors_they_mean() -> None:
    from gateway.chaos.clouds import exception_frame
    from gateway.protocols.messages import parse_event
    from gateway.recovery.classify import is_transient_error
    from gateway.recovery.events import InBandError
    from gateway.upstream.eventstream import EventStreamDecoder

    for kind, transient in (
        ("rate_limit_error", True),  # throttlingException
        ("overloaded_error", True),  # serviceUnavailableException
        ("api_error", True),  # internalServerException
        ("invalid_request_error", False),  # validationException
    ):
        frame = exception_frame(kind, "Too many requests, please wait before trying again.")
        decoder = EventStreamDecoder()
        [data] = decoder.feed(frame[:7]) + decoder.feed(frame[7:])  # split across reads
        event = parse_event(data)
        assert isinstance(event, InBandError)
        assert is_transient_error(event.error) is transient, kind


def test_a_bad_frame_is_a_broken_stream_not_a_crash() -> None:
    from gateway.chaos.clouds import chunk_frame
    from gateway.upstream.eventstream import EventStreamDecoder

    frame = bytearray(chunk_frame(b'{"type":"ping"}'))
    frame[-1] ^= 0xFF  # the message CRC no longer matches
    with pytest.raises(httpx2.RemoteProtocolError):
        EventStreamDecoder().feed(bytes(frame))


def test_a_model_id_is_one_path_segment() -> None:
    from gateway.upstream.providers import _segment

    assert _segment("..", ":") == "%2E%2E"
    assert _segment("anthropic.claude-sonnet-4-5-v1:0", ":") == "anthropic.claude-sonnet-4-5-v1:0"
    arn = "arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude"
    assert "/" not in _segment(arn, ":")


@pytest.mark.parametrize(
    ("primary", "other", "protocol"),
    [("anthropic", "bedrock", "messages"), ("anthropic", "vertex", "messages")]
    + [("openai", "azure", "chat"), ("openai", "azure-deployments", "chat")],
)
@pytest.mark.parametrize("at", [0, 1])
def test_a_stream_cut_before_or_at_its_first_delta_is_answered_by_the_other_provider(
    chaos: ChaosUpstream, primary: str, other: str, protocol: str, at: int
) -> None:
    # Nothing (or one delta) sent: the other provider restarts or continues from there.
    seed = 520 + ["bedrock", "vertex", "azure", "azure-deployments"].index(other) * 2 + at
    answer = f"chaos:text=20,seed={seed}"
    cut = f"{answer},fault=reset,at={at}"
    with running_gateway(config(chaos, primary, other, answer)) as gateway:
        if protocol == "messages":
            events = raw_messages(gateway, cut)
            check_contract(events)
            said = text(events)
        else:
            with gpt(gateway) as sdk:
                chunks = sdk.chat.completions.create(
                    model=cut, messages=[{"role": "user", "content": "x"}], stream=True
                )
                said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert said == expected_answer(answer).text
    [continued] = chaos.requests_for(answer)
    assert continued.dialect in ("bedrock", "vertex", "azure")


def test_a_frame_is_bounded_by_max_event_bytes_while_it_arrives() -> None:
    from gateway.chaos.clouds import chunk_frame
    from gateway.upstream.eventstream import FRAME_OVERHEAD, EventStreamDecoder
    from gateway.upstream.sse import EventTooLarge

    def bound(max_event_bytes: int) -> int:
        return max_event_bytes * 4 // 3 + FRAME_OVERHEAD

    event = b'{"type":"content_block_delta","delta":{"type":"text_delta","text":"' + b"x" * 9000
    event += b'"}}'
    frame = chunk_frame(event)  # its base64 in JSON: about 4/3 of it, and the headers
    # An event of max_event_bytes fits, read in small pieces.
    decoder = EventStreamDecoder(max_event_bytes=len(event))
    decoded = [d for start in range(0, len(frame), 100) for d in decoder.feed(frame[start:][:100])]
    assert decoded == [event]

    # The edges: all but its last byte held is within the smallest bound that holds
    # them; one byte less, and the frame is refused before it is whole.
    held = len(frame) - 1
    smallest = next(m for m in range(1, len(frame)) if bound(m) >= held)
    assert bound(smallest - 1) < held
    decoder = EventStreamDecoder(max_event_bytes=smallest)
    assert decoder.feed(frame[:-1]) == [] and decoder.feed(frame[-1:]) == [event]
    decoder = EventStreamDecoder(max_event_bytes=smallest - 1)
    with pytest.raises(EventTooLarge):
        decoder.feed(frame[:-1])

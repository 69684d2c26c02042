"""The chaos upstream's cloud dialects, checked by the clients that speak them: the
anthropic SDK's ``AnthropicBedrock`` (SigV4, AWS event stream framing) and
``AnthropicVertex`` (OAuth bearer, ``streamRawPredict``), and the openai SDK's
``AzureOpenAI`` (``api-key``, deployments and ``api-version``). Each must stream and
parse every event; faults reach each as the real service's errors would."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest
from anthropic import AnthropicBedrock, AnthropicVertex
from anthropic.types import MessageParam

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.chaos.clouds import AZURE_KEY, BEDROCK_CREDENTIALS, VERTEX_TOKEN

USER: list[MessageParam] = [{"role": "user", "content": "Say something."}]
[(KEY_ID, SECRET)] = BEDROCK_CREDENTIALS.items()


def root(chaos: ChaosUpstream) -> str:
    return chaos.base_url.removesuffix("/v1")


def bedrock_client(
    chaos: ChaosUpstream, key_id: str = KEY_ID, secret: str = SECRET
) -> AnthropicBedrock:
    return AnthropicBedrock(
        aws_access_key=key_id,
        aws_secret_key=secret,
        aws_region="us-east-1",
        base_url=root(chaos),
        max_retries=0,
    )


@pytest.fixture
def bedrock(chaos: ChaosUpstream) -> Iterator[AnthropicBedrock]:
    with bedrock_client(chaos) as client:
        yield client


@pytest.fixture
def vertex(chaos: ChaosUpstream) -> Iterator[AnthropicVertex]:
    with AnthropicVertex(
        region="us-east5",
        project_id="chaos-project",
        access_token=VERTEX_TOKEN,
        base_url=chaos.base_url,  # .../v1, as Vertex's
        max_retries=0,
    ) as client:
        yield client


def claude_clients(
    bedrock: AnthropicBedrock, vertex: AnthropicVertex
) -> dict[str, AnthropicBedrock | AnthropicVertex]:
    return {"bedrock": bedrock, "vertex": vertex}


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
@pytest.mark.parametrize("tools", [0, 2])
def test_the_sdks_cloud_client_streams_and_parses_every_event(
    chaos: ChaosUpstream,
    bedrock: AnthropicBedrock,
    vertex: AnthropicVertex,
    cloud: str,
    tools: int,
) -> None:
    client = claude_clients(bedrock, vertex)[cloud]
    model = f"chaos:text=40,seed=301,tools={tools}"
    chaos.requests.clear()
    with client.messages.stream(model=model, max_tokens=1024, messages=USER) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text == expected_answer(model).text
    assert len([b for b in message.content if b.type == "tool_use"]) == tools
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert message.usage.output_tokens > 0
    [request] = chaos.requests
    assert request.dialect == cloud
    received = request.received
    assert "model" not in received
    assert received["anthropic_version"]  # the SDK's dated version: the dialects take it
    if cloud == "bedrock":
        assert "stream" not in received
        assert request.path.endswith("/invoke-with-response-stream")
    else:
        assert request.path.endswith(":streamRawPredict")


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
def test_the_sdks_cloud_client_reads_a_whole_answer(
    bedrock: AnthropicBedrock, vertex: AnthropicVertex, cloud: str
) -> None:
    client = claude_clients(bedrock, vertex)[cloud]
    model = "chaos:text=12,seed=302"
    message = client.messages.create(model=model, max_tokens=1024, messages=USER)
    assert message.content[0].type == "text"
    assert message.content[0].text == expected_answer(model).text


@pytest.mark.parametrize("cloud", ["bedrock", "vertex"])
@pytest.mark.parametrize(
    ("fault", "raised"),
    [
        ("error", anthropic.APIStatusError),  # an exception frame / error event mid-stream
        ("http_429", anthropic.RateLimitError),
        ("http_500", anthropic.InternalServerError),
    ],
)
def test_faults_reach_the_sdks_cloud_client_as_the_services_errors(
    bedrock: AnthropicBedrock,
    vertex: AnthropicVertex,
    cloud: str,
    fault: str,
    raised: type[Exception],
) -> None:
    client = claude_clients(bedrock, vertex)[cloud]
    model = f"chaos:text=30,seed=303,fault={fault},at=5"
    with (
        pytest.raises(raised),
        client.messages.stream(model=model, max_tokens=1024, messages=USER) as stream,
    ):
        for _ in stream:
            pass


def test_bedrock_checks_the_sigv4_signature(chaos: ChaosUpstream) -> None:
    with bedrock_client(chaos, secret="not-the-secret") as wrong:
        with pytest.raises(anthropic.PermissionDeniedError, match="signature"):
            wrong.messages.create(model="chaos:text=3", max_tokens=10, messages=USER)
    with bedrock_client(chaos, key_id="AKIDUNKNOWN") as unknown:
        with pytest.raises(anthropic.PermissionDeniedError, match="security token"):
            unknown.messages.create(model="chaos:text=3", max_tokens=10, messages=USER)


def test_vertex_checks_the_bearer_token(chaos: ChaosUpstream) -> None:
    with AnthropicVertex(
        region="us-east5",
        project_id="p",
        access_token="ya29.not-issued",
        base_url=chaos.base_url,
        max_retries=0,
    ) as wrong:
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(model="chaos:text=3", max_tokens=10, messages=USER)


@pytest.mark.parametrize("form", ["deployments", "v1"])
def test_azure_openai_clients_stream_chat_and_responses(chaos: ChaosUpstream, form: str) -> None:
    model = "chaos:text=20,seed=304"
    client: openai.OpenAI
    if form == "deployments":
        client = openai.AzureOpenAI(
            api_key=AZURE_KEY, api_version="2024-10-21", azure_endpoint=root(chaos), max_retries=0
        )
    else:
        client = openai.OpenAI(
            api_key="unused",
            base_url=root(chaos) + "/openai/v1",
            default_headers={"api-key": AZURE_KEY},
            max_retries=0,
        )
    chaos.requests.clear()
    with client:
        chunks = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        with client.responses.stream(model=model, input="x") as events:
            response = events.get_final_response()
    assert text == response.output_text == expected_answer(model).text
    assert [r.dialect for r in chaos.requests] == ["azure", "azure"]
    if form == "deployments":
        assert "deployments/" in chaos.requests[0].path
        assert "api-version=2024-10-21" in chaos.requests[0].query


def test_azure_refuses_a_wrong_key(chaos: ChaosUpstream) -> None:
    with openai.AzureOpenAI(
        api_key="wrong", api_version="2024-10-21", azure_endpoint=root(chaos), max_retries=0
    ) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(
                model="chaos:text=2", messages=[{"role": "user", "content": "x"}]
            )

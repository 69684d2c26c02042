"""OpenAI's background mode on the chaos upstream: the generation outlives its connection,
a retrieve re-attaches ``starting_after`` the last event read, cancel stops it, and it is
forgotten a while after it ended. Checked with the openai SDK as the client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.chaos import ChaosUpstream, expected_answer, running_chaos_upstream
from gateway.chaos.clouds import AZURE_KEY

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
# A reasoning summary, text and a tool call: at= can land in each.
ANSWER = "text=12,reasoning=3,tools=1,arg_deltas=3,seed=7"
OPENING = ["response.created", "response.queued", "response.in_progress"]
CUT = (openai.APIConnectionError, httpx2.TransportError)


@pytest.fixture
def sdk(upstream: ChaosUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=upstream.base_url, api_key="chaos", max_retries=0) as client:
        yield client


@dataclass
class Said:
    """What a client makes of a Responses stream's events."""

    types: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    text: str = ""
    reasoning: str = ""
    arguments: str = ""
    last: Any = None


def said(events: list[Any]) -> Said:
    out = Said()
    for event in events:
        out.types.append(event.type)
        out.numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            out.text += event.delta
        elif event.type == "response.reasoning_summary_text.delta":
            out.reasoning += event.delta
        elif event.type == "response.function_call_arguments.delta":
            out.arguments += event.delta
        out.last = event
    return out


def read_until_cut(stream: Any) -> tuple[list[Any], BaseException | None]:
    """The events of an SDK stream until it ends or its connection breaks."""
    events: list[Any] = []
    try:
        for event in stream:
            events.append(event)
    except CUT as exc:
        return events, exc
    return events, None


def generations(upstream: ChaosUpstream) -> int:
    return sum(1 for r in upstream.requests if (r.method, r.path) == ("POST", "/v1/responses"))


def unbroken(sdk: openai.OpenAI, model: str) -> Said:
    """The same answer, on an ordinary (not background) request."""
    return said(list(sdk.responses.create(model=model, input="Say something.", stream=True)))


# --- re-attaching after a cut -----------------------------------------------------------


@pytest.mark.parametrize("fault", ["reset", "close", "no_finish", "stall"])
@pytest.mark.parametrize(
    "at", [0, 2, 8, 14], ids=["before-any-delta", "mid-reasoning", "mid-text", "mid-arguments"]
)
def test_a_cut_create_is_resumed_by_retrieve_starting_after(
    upstream: ChaosUpstream, sdk: openai.OpenAI, fault: str, at: int
) -> None:
    model = f"chaos:{ANSWER},pace_ms=1,fault={fault},at={at},stall_s=5"
    first, error = read_until_cut(
        sdk.responses.create(
            model=model, input="Say something.", background=True, stream=True, timeout=0.5
        )
    )
    assert (error is None) == (fault == "no_finish")  # a clean end, too early
    assert said(first).types[:3] == OPENING
    assert said(first).types[-1] != "response.completed"
    response_id = first[0].response.id
    rest = list(
        sdk.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number)
    )
    whole = said(first + rest)
    reference = unbroken(sdk, f"chaos:{ANSWER}")
    assert whole.numbers == list(range(len(whole.numbers)))
    assert whole.types == OPENING + reference.types[2:]
    assert (whole.text, whole.reasoning, whole.arguments) == (
        reference.text,
        reference.reasoning,
        reference.arguments,
    )
    assert whole.text == expected_answer(model).text
    assert whole.last.type == "response.completed"
    assert whole.last.response.usage == reference.last.response.usage
    assert whole.last.response.background is True
    assert generations(upstream) == 2  # the background one, then the reference
    assert upstream.backgrounds.started == 1


def test_a_retrieve_from_the_start_says_the_creates_bytes(
    upstream: ChaosUpstream, client: httpx2.Client
) -> None:
    # More events than one write carries (256), framed as the spec says.
    body = {"model": "chaos:text=600,reasoning=3,lineend=crlf,comments=1", "input": "hi"}
    created = client.post("/responses", json=body | {"background": True, "stream": True})
    objects = data_of(created.content)
    retrieved = client.get(f"/responses/{objects[0]['response']['id']}", params={"stream": "true"})
    assert retrieved.status_code == 200
    assert retrieved.content == created.content
    assert retrieved.headers["content-type"] == "text/event-stream"


def test_malformed_garbles_the_creating_connection_alone(client: httpx2.Client) -> None:
    body = {"model": "chaos:text=8,fault=malformed,at=2", "input": "hi"}
    created = client.post("/responses", json=body | {"background": True, "stream": True})
    lines = created.content.split(b"\n")  # one data line is not JSON, on this connection
    garbled = [line for line in lines if line.startswith(b"data: ") and not line.endswith(b"}")]
    assert len(garbled) == 1
    objects = data_of(b"\n".join(line for line in lines if line not in garbled))
    path = f"/responses/{objects[0]['response']['id']}"
    retrieved = client.get(path, params={"stream": "true"}).content
    assert data_of(retrieved) == objects
    assert objects[-1]["type"] == "response.completed"


def test_retrieve_faults_cut_the_first_retrieves_too(
    upstream: ChaosUpstream, sdk: openai.OpenAI
) -> None:
    model = f"chaos:{ANSWER},fault=reset,at=3,retrieve_faults=2"
    events, error = read_until_cut(
        sdk.responses.create(model=model, input="hi", background=True, stream=True)
    )
    assert error is not None
    response_id = events[0].response.id
    cuts = 0
    while not events or events[-1].type != "response.completed":
        more, error = read_until_cut(
            sdk.responses.retrieve(
                response_id, stream=True, starting_after=events[-1].sequence_number
            )
        )
        if error is not None:  # cut after at=3 more deltas
            cuts += 1
            assert sum(e.type.endswith(".delta") for e in more) == 3
        events += more
    assert cuts == 2
    whole = said(events)
    assert whole.numbers == list(range(len(events)))
    assert whole.text == expected_answer(model).text
    retrieves = [r for r in upstream.requests if r.method == "GET"]
    assert len(retrieves) == 3
    assert generations(upstream) == 1


# --- a generation without a reader ------------------------------------------------------


def test_the_generation_goes_on_while_nobody_reads(
    upstream: ChaosUpstream, sdk: openai.OpenAI
) -> None:
    model = "chaos:text=20,pace_ms=20,fault=reset,at=1"
    first, _ = read_until_cut(
        sdk.responses.create(model=model, input="hi", background=True, stream=True)
    )
    response_id = first[0].response.id
    assert upstream.backgrounds.status(response_id) == "in_progress"
    assert sdk.responses.retrieve(response_id).status == "in_progress"
    time.sleep(0.6)  # 26 events at 20 ms: the generation has ended
    assert upstream.backgrounds.status(response_id) == "completed"
    started = time.monotonic()
    rest = list(
        sdk.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number)
    )
    assert time.monotonic() - started < 0.2  # all generated: at once, not in 0.4 s
    assert said(first + rest).text == expected_answer(model).text
    stored = sdk.responses.retrieve(response_id)
    assert stored.status == "completed"
    assert stored.output_text == expected_answer(model).text
    assert stored.usage is not None and stored.usage.output_tokens == 20


def test_a_retrieve_mid_generation_shows_the_output_so_far(
    upstream: ChaosUpstream, sdk: openai.OpenAI
) -> None:
    model = "chaos:text=40,pace_ms=15,fault=close,at=5"
    first, _ = read_until_cut(
        sdk.responses.create(model=model, input="hi", background=True, stream=True)
    )
    stored = sdk.responses.retrieve(first[0].response.id)
    assert stored.status == "in_progress"
    assert stored.usage is None
    assert len(stored.output_text) >= len(said(first).text)
    assert expected_answer(model).text.startswith(stored.output_text)


def test_a_non_streaming_create_answers_queued_at_once(
    upstream: ChaosUpstream, sdk: openai.OpenAI
) -> None:
    created = sdk.responses.create(model="chaos:text=6", input="hi", background=True)
    assert (created.status, created.background, created.output) == ("queued", True, [])
    stored = sdk.responses.retrieve(created.id)
    assert stored.status == "completed"
    assert stored.output_text == expected_answer("chaos:text=6").text
    # Only a response created with stream=true can be streamed again (OpenAI's limit).
    with pytest.raises(openai.BadRequestError):
        list(sdk.responses.retrieve(created.id, stream=True))


# --- an in-band error: the background response fails -------------------------------------


@pytest.mark.parametrize("fault", ["error", "error_fatal"])
def test_an_in_band_error_fails_the_response_for_every_reader(
    upstream: ChaosUpstream, sdk: openai.OpenAI, fault: str
) -> None:
    model = f"chaos:text=10,fault={fault},at=4"
    first = said(list(sdk.responses.create(model=model, input="hi", background=True, stream=True)))
    assert first.types[-2:] == ["error", "response.failed"]
    assert first.text == expected_answer(model).text[: len(first.text)]
    assert first.last.response.status == "failed"
    response_id = first.last.response.id
    again = said(list(sdk.responses.retrieve(response_id, stream=True)))
    assert (again.types, again.numbers, again.text) == (first.types, first.numbers, first.text)
    after = list(sdk.responses.retrieve(response_id, stream=True, starting_after=3))
    assert said(after).types[-2:] == ["error", "response.failed"]
    stored = sdk.responses.retrieve(response_id)
    assert stored.status == "failed"
    assert stored.error is not None
    assert stored.output_text == first.text
    assert upstream.backgrounds.status(response_id) == "failed"


# --- cancel ---------------------------------------------------------------------------


def test_cancel_stops_the_generation(upstream: ChaosUpstream, sdk: openai.OpenAI) -> None:
    model = "chaos:text=60,pace_ms=10"
    with sdk.responses.create(model=model, input="hi", background=True, stream=True) as stream:
        first: list[Any] = [event for _, event in zip(range(6), stream, strict=False)]
    response_id = first[0].response.id
    # A reader attached when the cancel comes: its body ends cleanly, without a terminal event.
    attached: list[Any] = []
    reading = threading.Thread(
        target=lambda: attached.extend(sdk.responses.retrieve(response_id, stream=True))
    )
    reading.start()
    time.sleep(0.05)
    cancelled = sdk.responses.cancel(response_id)
    reading.join(5)
    assert not reading.is_alive()
    assert cancelled.status == "cancelled"
    assert attached and said(attached).types[-1] == "response.output_text.delta"
    assert expected_answer(model).text.startswith(cancelled.output_text)
    generated = list(sdk.responses.retrieve(response_id, stream=True))
    time.sleep(0.05)  # five more paces: nothing more is generated
    assert [e.sequence_number for e in sdk.responses.retrieve(response_id, stream=True)] == [
        e.sequence_number for e in generated
    ]
    assert said(generated).text == cancelled.output_text
    assert said(attached).text == cancelled.output_text
    assert sdk.responses.retrieve(response_id).status == "cancelled"
    assert sdk.responses.cancel(response_id).status == "cancelled"  # idempotent
    cancels = [r for r in upstream.requests if r.path == f"/v1/responses/{response_id}/cancel"]
    assert [r.method for r in cancels] == ["POST", "POST"]


def test_cancelling_an_ended_response_is_refused(sdk: openai.OpenAI) -> None:
    created = sdk.responses.create(model="chaos:text=3", input="hi", background=True)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a completed response"):
        sdk.responses.cancel(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.cancel("resp_unknown")


# --- refusals and expiry --------------------------------------------------------------


def test_background_with_store_false_is_refused(
    upstream: ChaosUpstream, sdk: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model="chaos", input="hi", background=True, store=False, stream=True)
    assert refused.value.status_code == 400
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "background"
    assert "store=true" in error["message"]
    assert upstream.backgrounds.started == 0


def test_an_unknown_id_is_not_found(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="No response found with id 'resp_nope'"):
        sdk.responses.retrieve("resp_nope")
    with pytest.raises(openai.NotFoundError):
        list(sdk.responses.retrieve("resp_nope", stream=True, starting_after=3))


def test_an_ordinary_response_is_not_kept(sdk: openai.OpenAI) -> None:
    created = sdk.responses.create(model="chaos:text=3", input="hi")
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)


def test_a_response_is_forgotten_ttl_after_it_ended() -> None:
    with (
        running_chaos_upstream(background_ttl=0.2) as upstream,
        openai.OpenAI(base_url=upstream.base_url, api_key="chaos", max_retries=0) as sdk,
    ):
        created = sdk.responses.create(model="chaos:text=3", input="hi", background=True)
        assert sdk.responses.retrieve(created.id).status == "completed"
        time.sleep(0.3)
        assert upstream.backgrounds.status(created.id) is None
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            list(sdk.responses.retrieve(created.id, stream=True, starting_after=0))


# --- the wire, as strict clients read it ------------------------------------------------


def data_of(raw: bytes) -> list[dict[str, Any]]:
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    return [orjson.loads(line[6:]) for line in lines if line.startswith(b"data: ")]


def test_every_raw_event_validates_against_the_sdks_types(client: httpx2.Client) -> None:
    body = {"model": f"chaos:{ANSWER},fault=reset,at=6", "input": "hi"}
    created: list[bytes] = []
    with (
        pytest.raises(httpx2.TransportError),
        client.stream("POST", "/responses", json=body | {"background": True, "stream": True}) as s,
    ):
        created.extend(s.iter_raw())
    first = data_of(b"".join(created))
    path = f"/responses/{first[0]['response']['id']}"
    params = {"stream": "true", "starting_after": str(first[-1]["sequence_number"])}
    rest = data_of(client.get(path, params=params).content)
    events = first + rest
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["response"]["status"] for event in events[:3]] == [
        "queued",
        "queued",
        "in_progress",
    ]
    final = events[-1]["response"]
    assert (final["status"], final["background"], final["store"]) == ("completed", True, True)
    Response.model_validate(client.get(path).json(), strict=False)


def test_azure_door_retrieves_and_cancels(upstream: ChaosUpstream) -> None:
    headers = {"api-key": AZURE_KEY}
    with httpx2.Client(base_url=f"http://127.0.0.1:{upstream.port}", timeout=5) as client:
        body = {"model": "chaos:text=30,pace_ms=10", "input": "hi", "background": True}
        created = client.post("/openai/v1/responses", json=body, headers=headers).json()
        path = f"/openai/v1/responses/{created['id']}"
        assert client.get(path, headers=headers).json()["status"] in ("queued", "in_progress")
        assert client.post(path + "/cancel", headers=headers).json()["status"] == "cancelled"
        assert client.get(path).status_code == 401  # no key

"""OpenTelemetry traces, end to end: the gateway exports over OTLP/HTTP (protobuf) to a
receiver on loopback that decodes the official protobuf messages; the openai and
anthropic SDKs are the clients, sending a ``traceparent``; the chaos upstream records
the ``traceparent`` of every request it gets.

A stream recovered once is one trace: the client's trace id on every span and on
every upstream request, the run's span a child of the client's, one leg span per
upstream request (each request's ``traceparent`` names its own leg span), the
interruption on the broken leg, the recovery on the run, and the usage the client was
told. Off (the default), the gateway adds no header and starts no exporter thread.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from openai import OpenAI

from gateway.chaos import ChaosUpstream, expected_answer
from gateway.config.schema import ConfigError, Tracing
from gateway.otel_env import check_protocol, tracing_enabled
from tests.otlp import Receiver, Span, running_receiver
from tests.servers import RunningGateway, gateway_config, running_gateway, wait_for

FAST_RETRY = {"backoff_initial": 0.01, "backoff_max": 0.05, "idle_retry_delay": 0.01}
UPSTREAM_KEY = "sk-upstream-secret-0451"
UPSTREAM = {
    "api_key": UPSTREAM_KEY,
    "timeouts": {"connect": 2, "first_byte": 3, "idle": 0.5},
    "protocols": ["chat", "responses", "messages"],
}
CLIENT_KEY = "sk-client-secret-7731"
PROMPT = "Tell me about the lighthouse keeper's otter."
SEEDS = {"chat": 80, "responses": 81, "messages": 82}


class Traceparent:
    """A client's span: the W3C ``traceparent`` it sends."""

    def __init__(self) -> None:
        self.trace_id = secrets.token_hex(16)
        self.span_id = secrets.token_hex(8)

    @property
    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-01"


def parse(traceparent: str) -> tuple[str, str]:
    """(trace id, parent span id) of a ``traceparent`` header."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and int(flags, 16) & 1, traceparent  # sampled
    return trace_id, span_id


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def traced_config(
    chaos: ChaosUpstream, receiver: Receiver, state: dict[str, Any] | None = None, **tracing: Any
) -> Any:
    route = {"match": "*", "upstream": "chaos", "retry": FAST_RETRY}
    return gateway_config(
        chaos.base_url,
        upstream=UPSTREAM,
        routes=[route],
        tracing={"enabled": True, "endpoint": receiver.url} | tracing,
        state=state or {},
    )


@pytest.fixture(scope="module", autouse=True)
def _export_fast() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms, not 5 s
        yield


@pytest.fixture(scope="module")
def traced(chaos: ChaosUpstream, receiver: Receiver) -> Iterator[RunningGateway]:
    with running_gateway(traced_config(chaos, receiver)) as running:
        yield running


def openai_sdk(gateway: RunningGateway, traceparent: Traceparent | None = None) -> OpenAI:
    headers = {} if traceparent is None else {"traceparent": traceparent.header}
    return OpenAI(
        base_url=gateway.base_url, api_key=CLIENT_KEY, max_retries=0, default_headers=headers
    )


def anthropic_sdk(gateway: RunningGateway, traceparent: Traceparent) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=gateway.url,
        api_key=CLIENT_KEY,
        max_retries=0,
        default_headers={"traceparent": traceparent.header},
    )


def ask(gateway: RunningGateway, protocol: str, model: str, stream: bool, tp: Traceparent) -> Any:
    """Ask through the SDK of ``protocol``; (answer id, text, usage in, usage out)."""
    messages: Any = [{"role": "user", "content": PROMPT}]
    if protocol == "messages":
        with anthropic_sdk(gateway, tp) as claude:
            if not stream:
                message = claude.messages.create(model=model, max_tokens=1000, messages=messages)
                usage = message.usage
                text = "".join(b.text for b in message.content if b.type == "text")
                return message.id, text, usage.input_tokens, usage.output_tokens
            with claude.messages.stream(model=model, max_tokens=1000, messages=messages) as events:
                # Summed over legs in message_delta (the helper keeps message_start's).
                [delta] = [event.usage for event in events if event.type == "message_delta"]
                message = events.get_final_message()
            text = "".join(b.text for b in message.content if b.type == "text")
            return message.id, text, delta.input_tokens, delta.output_tokens
    with openai_sdk(gateway, tp) as sdk:
        if protocol == "responses":
            response: Any
            if stream:
                with sdk.responses.stream(model=model, input=PROMPT) as responses:
                    for _ in responses:
                        pass
                    response = responses.get_final_response()
            else:
                response = sdk.responses.create(model=model, input=PROMPT)
            assert response.usage is not None
            used = response.usage
            return response.id, response.output_text, used.input_tokens, used.output_tokens
        if stream:
            chunks = sdk.chat.completions.create(
                model=model,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
            ident, text, completion_usage = "", "", None
            for chunk in chunks:
                ident = chunk.id
                text += "".join(c.delta.content or "" for c in chunk.choices)
                completion_usage = chunk.usage or completion_usage
        else:
            completion = sdk.chat.completions.create(
                model=model,
                messages=messages,
            )
            ident, completion_usage = completion.id, completion.usage
            text = completion.choices[0].message.content or ""
        assert completion_usage is not None
        used_in, used_out = completion_usage.prompt_tokens, completion_usage.completion_tokens
        return ident, text, used_in, used_out


def run_span(spans: list[Span]) -> Span:
    [run] = [s for s in spans if s.kind == "server"]
    return run


def leg_spans(spans: list[Span], run: Span) -> list[Span]:
    return sorted(
        (s for s in spans if s.parent_id == run.span_id),
        key=lambda s: (s.attributes["gateway.leg"], s.attributes["gateway.attempt"]),
    )


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_a_stream_recovered_once_is_one_trace_from_the_client_to_every_upstream_request(
    traced: RunningGateway,
    chaos: ChaosUpstream,
    receiver: Receiver,
    protocol: str,
    stream: bool,
) -> None:
    seed = SEEDS[protocol] + (10 if stream else 0)
    model = f"chaos:text=30,seed={seed},fault=reset,at=12,times=1,usage=1"
    client = Traceparent()
    answer_id, text, usage_in, usage_out = ask(traced, protocol, model, stream, client)
    assert text == expected_answer(model).text  # recovered, whole

    spans = receiver.trace(client.trace_id)
    assert {s.trace_id for s in spans} == {client.trace_id}
    run = run_span(spans)
    assert run.parent_id == client.span_id
    assert run.name == f"chat {model}"
    attributes = run.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == model
    assert attributes["gen_ai.response.id"] == answer_id
    assert attributes["gateway.protocol"] == protocol
    assert attributes["gateway.stream"] is stream
    assert attributes["gateway.outcome"] == "done"
    assert attributes["gateway.recoveries"] == 1
    assert attributes["gateway.attempts"] == 2
    # Summed over both legs: what the client was told.
    assert attributes["gen_ai.usage.input_tokens"] == usage_in
    assert attributes["gen_ai.usage.output_tokens"] == usage_out
    assert attributes["gen_ai.response.finish_reasons"]
    assert attributes["gateway.time_to_first_token_s"] > 0
    [(_, recovery)] = [e for e in run.events if e[0] == "gateway.recovery"]
    assert recovery["gateway.interruption.cause"] == "reset"
    assert recovery["gateway.recovery.plan"] == "continue_text"

    first, second = leg_spans(spans, run)
    assert first.kind == second.kind == "client"
    assert first.attributes["gateway.continuation"] == "none"
    assert second.attributes["gateway.continuation"] == "continue_text"
    assert second.attributes["gateway.continuation.mode"] in ("prompt", "prefill")
    for leg in (first, second):
        assert leg.attributes["gateway.upstream"] == "chaos"
        assert leg.attributes["server.address"] == "127.0.0.1"
        assert leg.attributes["http.response.status_code"] == 200
    [(_, interruption)] = first.events
    assert interruption["gateway.interruption.cause"] == "reset"
    assert first.status == 2  # error
    assert first.attributes["error.type"] == "reset"
    assert second.status != 2 and not second.events

    # Each upstream request carried its own leg span's traceparent, in the client's trace.
    requests = chaos.requests_for(model)
    assert len(requests) == 2
    carried = [parse(r.headers["traceparent"]) for r in requests]
    assert carried == [(client.trace_id, first.span_id), (client.trace_id, second.span_id)]


PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


def start_and_leave(gateway: RunningGateway, protocol: str, model: str, tp: Traceparent) -> str:
    """Start a stream, read 6 of its events, hang up; the run id."""
    field = "input" if protocol == "responses" else "messages"
    asked: Any = PROMPT if protocol == "responses" else [{"role": "user", "content": PROMPT}]
    body = {"model": model, field: asked, "stream": True, "max_tokens": 1000}
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "traceparent": tp.header}
    url = gateway.base_url + PATHS[protocol]
    with httpx2.stream("POST", url, json=body, headers=headers, timeout=10) as response:
        assert response.status_code == 200
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data:")
            if events == 6:
                return response.headers["x-run-id"]
    raise AssertionError("the run ended before its client left")


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_a_takeover_is_a_run_span_in_the_resuming_clients_trace_linked_to_the_first(
    chaos: ChaosUpstream, receiver: Receiver, protocol: str
) -> None:
    # Its client gone, the run is stopped after its detach grace (its span ends,
    # detached); a resume takes it over from the checkpoint, on a span of its own.
    model = f"chaos:text=60,seed={SEEDS[protocol] + 20},pace_ms=15"
    first_call = Traceparent()
    resume_call = Traceparent()
    resume_call.trace_id = first_call.trace_id
    config = traced_config(chaos, receiver, state={"detach_grace": 0.1})
    with running_gateway(config) as gateway:
        run_id = start_and_leave(gateway, protocol, model, first_call)
        wait_for(
            lambda: (
                gateway.metrics.registry.get_sample_value("gateway_detached_runs_cancelled_total")
                == 1
            )
        )
        headers = {
            "authorization": f"Bearer {CLIENT_KEY}",
            "last-event-id": "6",
            "traceparent": resume_call.header,
        }
        rest = httpx2.get(f"{gateway.base_url}/runs/{run_id}/events", headers=headers, timeout=10)
        assert rest.status_code == 200 and "data:" in rest.text
        spans = receiver.trace(first_call.trace_id, runs=2)
        [resume] = receiver.resumes(run_id)
    first, taken = sorted(
        (s for s in spans if s.kind == "server" and s.name != "resume"),
        key=lambda s: "gateway.takeover" in s.attributes,
    )
    assert first.parent_id == first_call.span_id
    assert first.attributes["gateway.outcome"] == "detached"
    # The resume request's span, in the client's trace; the run it took over, its child.
    assert resume.parent_id == resume_call.span_id
    assert resume.attributes["gateway.resume.kind"] == "takeover"
    assert taken.parent_id == resume.span_id
    assert taken.attributes["gateway.takeover"] is True
    assert taken.attributes["gateway.outcome"] == "done"
    assert taken.links == [(first.trace_id, first.span_id)]
    [(_, recovery)] = [e for e in taken.events if e[0] == "gateway.recovery"]
    assert recovery["gateway.interruption.cause"] == "detached"
    [first_leg] = leg_spans(spans, first)
    [continued] = leg_spans(spans, taken)
    assert continued.attributes["gateway.continuation"] == "continue_text"
    carried = [parse(r.headers["traceparent"]) for r in chaos.requests_for(model)]
    assert carried == [
        (first_call.trace_id, first_leg.span_id),
        (first_call.trace_id, continued.span_id),
    ]


@pytest.mark.parametrize("in_trace", [True, False], ids=["client-context", "linked"])
def test_a_resume_is_a_span_in_the_resuming_clients_trace_linked_to_the_run(
    traced: RunningGateway, chaos: ChaosUpstream, receiver: Receiver, in_trace: bool
) -> None:
    # The client leaves a live run and comes back with another request (often another
    # trace): the resume is a span of that request, linked to the run's span.
    model = f"chaos:text=40,seed={95 + in_trace},pace_ms=15"
    first_call, resume_call = Traceparent(), Traceparent()
    run_id = start_and_leave(traced, "chat", model, first_call)
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "last-event-id": "6"}
    if in_trace:
        headers["traceparent"] = resume_call.header
    rest = httpx2.get(f"{traced.base_url}/runs/{run_id}/events", headers=headers, timeout=10)
    assert rest.status_code == 200 and rest.text.rstrip().endswith("data: [DONE]")
    run = run_span(receiver.trace(first_call.trace_id))
    [resume] = receiver.resumes(run_id)
    if in_trace:
        assert (resume.trace_id, resume.parent_id) == (resume_call.trace_id, resume_call.span_id)
    else:
        assert resume.trace_id != first_call.trace_id and resume.parent_id == ""
    assert resume.kind == "server"
    assert resume.links == [(run.trace_id, run.span_id)]
    assert resume.attributes["gateway.resume.kind"] == "local"
    assert resume.attributes["gateway.resume.after"] == 6
    assert resume.attributes["gateway.resume.bytes"] == len(rest.content)
    assert resume.status != 2


def test_a_head_is_not_a_resume_it_claims_nothing(chaos: ChaosUpstream, receiver: Receiver) -> None:
    # A run nobody holds (stopped after its detach grace): a HEAD says it is there, and
    # neither takes it over, nor asks the upstream, nor makes a resume span; the GET
    # after it does all three.
    model = "chaos:text=40,seed=97,pace_ms=15"
    config = traced_config(chaos, receiver, state={"detach_grace": 0.1})
    with running_gateway(config) as gateway:
        run_id = start_and_leave(gateway, "chat", model, Traceparent())
        cancelled = "gateway_detached_runs_cancelled_total"
        wait_for(lambda: gateway.metrics.registry.get_sample_value(cancelled) == 1)
        headers = {"authorization": f"Bearer {CLIENT_KEY}", "last-event-id": "6"}
        url = f"{gateway.base_url}/runs/{run_id}/events"
        head = httpx2.head(url, headers=headers, timeout=10)
        assert head.status_code == 200 and head.content == b""
        assert httpx2.head(url + "x", headers=headers, timeout=10).status_code == 404
        taken = {"kind": "takeover", "outcome": "ok"}
        assert not gateway.metrics.registry.get_sample_value("gateway_resumes_total", taken)
        assert len(chaos.requests_for(model)) == 1
        rest = httpx2.get(url, headers=headers, timeout=10)
        assert rest.status_code == 200 and rest.text.rstrip().endswith("data: [DONE]")
        assert gateway.metrics.registry.get_sample_value("gateway_resumes_total", taken) == 1
        assert len(chaos.requests_for(model)) == 2
        [resume] = receiver.resumes(run_id)  # the GET's: the HEAD resumed nothing
        assert resume.attributes["gateway.resume.kind"] == "takeover"


def test_a_refused_resume_is_a_span_that_says_why(
    traced: RunningGateway, receiver: Receiver
) -> None:
    client = Traceparent()
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "traceparent": client.header}
    run_id = "run_" + secrets.token_hex(8)
    refused = httpx2.get(f"{traced.base_url}/runs/{run_id}/events", headers=headers, timeout=10)
    assert refused.status_code == 404
    [resume] = receiver.resumes(run_id)
    assert resume.parent_id == client.span_id and not resume.links
    assert resume.attributes["error.type"] == "run_not_found"
    assert "gateway.resume.kind" not in resume.attributes
    assert resume.status != 2  # the client's mistake, not the gateway's


def test_a_request_without_trace_context_starts_a_trace(
    traced: RunningGateway, chaos: ChaosUpstream, receiver: Receiver
) -> None:
    model = "chaos:text=5,seed=90"
    with openai_sdk(traced) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": PROMPT}]
        )
    spans = receiver.of_run(raw.headers["x-run-id"])
    run = run_span(spans)
    assert run.parent_id == ""  # a root span
    [leg] = leg_spans(spans, run)
    [request] = chaos.requests_for(model)
    assert parse(request.headers["traceparent"]) == (run.trace_id, leg.span_id)
    assert run.resource["service.name"] == "resumable-gateway"


def test_failed_attempts_and_an_error_answer_are_spans_in_error(
    traced: RunningGateway, chaos: ChaosUpstream, receiver: Receiver
) -> None:
    # 503 on every attempt: three attempts (two retries), then the client gets the 503.
    model = "chaos:text=5,seed=91,fault=http_503"
    client = Traceparent()
    with openai_sdk(traced, client) as sdk, pytest.raises(openai.APIStatusError) as raised:
        sdk.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], stream=True
        )
    assert raised.value.status_code == 503
    spans = receiver.trace(client.trace_id)
    run = run_span(spans)
    assert run.status == 2
    assert run.attributes["error.type"] == "503"
    legs = leg_spans(spans, run)
    assert [leg.attributes["gateway.attempt"] for leg in legs] == [0, 1, 2]
    for leg in legs:
        assert leg.attributes["http.response.status_code"] == 503
        assert leg.attributes["gateway.attempt.result"] == "http_503"
        assert leg.status == 2
    assert legs[1].attributes["gateway.backoff_s"] > 0
    carried = [parse(r.headers["traceparent"])[1] for r in chaos.requests_for(model)]
    assert carried == [leg.span_id for leg in legs]


def test_spans_hold_no_prompt_answer_or_credential_unless_content_capture_is_on(
    chaos: ChaosUpstream, receiver: Receiver
) -> None:
    model = "chaos:text=20,seed=92,fault=reset,at=8,times=1"
    answer = expected_answer(model).text
    with running_gateway(traced_config(chaos, receiver)) as gateway:
        client = Traceparent()
        ask(gateway, "chat", model, True, client)
        receiver.trace(client.trace_id)
    exported = b"".join(receiver.bodies)
    for secret in (CLIENT_KEY, UPSTREAM_KEY, PROMPT, answer[:40]):
        assert secret.encode() not in exported, secret

    receiver.clear()
    model = "chaos:text=20,seed=93,fault=reset,at=8,times=1"
    answer = expected_answer(model).text
    with running_gateway(traced_config(chaos, receiver, capture_content=True)) as gateway:
        client = Traceparent()
        ask(gateway, "chat", model, True, client)
        run = run_span(receiver.trace(client.trace_id))
    assert PROMPT in json.loads(run.attributes["gen_ai.input.messages"])["messages"][0]["content"]
    [output] = json.loads(run.attributes["gen_ai.output.messages"])
    assert output["parts"] == [{"type": "text", "content": answer}]
    exported = b"".join(receiver.bodies)
    for secret in (CLIENT_KEY, UPSTREAM_KEY):
        assert secret.encode() not in exported, secret


def exporter_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if "otel" in t.name.lower()}


def test_off_by_default_no_header_is_added_and_no_exporter_thread_runs(
    chaos: ChaosUpstream,
) -> None:
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in os.environ
    client = Traceparent()
    config = gateway_config(chaos.base_url)
    before = exporter_threads()  # other tests' gateways may still run
    with running_gateway(config) as gateway, openai_sdk(gateway) as sdk:
        assert exporter_threads() == before
        model = "chaos:text=5,seed=94"
        sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}])
        model_traced = "chaos:text=5,seed=95"
        sdk.chat.completions.create(
            model=model_traced,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"traceparent": client.header},
        )
        assert exporter_threads() == before
    [plain] = chaos.requests_for(model)
    assert "traceparent" not in plain.headers and "tracestate" not in plain.headers
    # The client's own trace context is passed through as it came, as any header is.
    [forwarded] = chaos.requests_for(model_traced)
    assert forwarded.headers["traceparent"] == client.header


def test_the_exporter_thread_stops_with_the_gateway(
    chaos: ChaosUpstream, receiver: Receiver
) -> None:
    before = exporter_threads()
    with running_gateway(traced_config(chaos, receiver)):
        started = exporter_threads() - before
        assert started
    assert not started & exporter_threads()


@pytest.mark.parametrize(
    ("config", "env", "on"),
    [
        ({}, {}, False),
        ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"enabled": False}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"enabled": True}, {}, True),
        ({"enabled": True}, {"OTEL_SDK_DISABLED": "true"}, False),
        (
            {},
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
            False,
        ),
    ],
)
def test_when_tracing_is_on(config: dict[str, Any], env: dict[str, str], on: bool) -> None:
    assert tracing_enabled(Tracing(**config), env) is on


def test_a_grpc_protocol_is_a_clear_config_error() -> None:
    check_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    with pytest.raises(ConfigError, match="http/protobuf"):
        check_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_the_resource_names_the_service_from_the_environment(
    chaos: ChaosUpstream, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=gw-eu,deployment.environment=prod")
    client = Traceparent()
    with running_gateway(traced_config(chaos, receiver)) as gateway, openai_sdk(gateway) as sdk:
        sdk.chat.completions.create(
            model="chaos:text=3,seed=96",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"traceparent": client.header},
        )
    run = run_span(receiver.trace(client.trace_id))
    assert run.resource["service.name"] == "gw-eu"
    assert run.resource["deployment.environment"] == "prod"


def test_a_tracestate_without_a_traceparent_is_not_passed_on(
    traced: RunningGateway, chaos: ChaosUpstream
) -> None:
    model = "chaos:text=3,seed=97"
    with openai_sdk(traced) as sdk:
        sdk.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"tracestate": "vendor=orphan"},
        )
    [request] = chaos.requests_for(model)
    assert "traceparent" in request.headers  # the gateway's own root
    assert "tracestate" not in request.headers


def test_a_failing_tracing_hook_is_logged_and_returns_its_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gateway.tracing import _safe

    @_safe(default={})
    def broken() -> dict[str, str]:
        raise RuntimeError("exporter gone")

    with caplog.at_level(logging.ERROR, logger="gateway.tracing"):
        assert broken() == {}
    assert "tracing hook failed" in caplog.text


def test_a_resume_span_ends_once_however_its_rest_ends(caplog: pytest.LogCaptureFixture) -> None:
    # Read to its end, closed unread (a client gone before the first read), dropped
    # unread, or failing: the span ends, once, with the bytes that went out.
    import asyncio
    import gc

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gateway.tracing import ResumeTrace

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("test")

    async def rest(fail: bool = False) -> Any:
        yield b"data: 1\n\n"
        if fail:
            raise httpx2.ReadError("gone")
        yield b"data: 2\n\n"

    async def scenarios() -> None:
        read = ResumeTrace(tracer.start_span("read")).follow(rest())
        assert read is not None
        assert [data async for data in read] == [b"data: 1\n\n", b"data: 2\n\n"]
        await read.aclose()  # after its end: no second end
        closed = ResumeTrace(tracer.start_span("closed")).follow(rest())
        assert closed is not None
        await closed.aclose()
        dropped = ResumeTrace(tracer.start_span("dropped")).follow(rest())
        del dropped
        gc.collect()
        failing = ResumeTrace(tracer.start_span("failing")).follow(rest(fail=True))
        assert failing is not None
        with pytest.raises(httpx2.ReadError):
            async for _ in failing:
                pass

    asyncio.run(scenarios())
    spans = exported.get_finished_spans()
    sent = {s.name: (s.attributes or {})["gateway.resume.bytes"] for s in spans}
    assert sent == {"read": 18, "closed": 0, "dropped": 0, "failing": 9}
    assert len(spans) == 4
    # The SDK logs a second end() (or an attribute set after the end) as a warning.
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]

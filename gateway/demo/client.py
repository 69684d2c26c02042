"""The demo's clients: plain httpx2 (and its SSE reader) for chat, the openai SDK's
``client.responses.stream()``, the anthropic SDK's ``client.messages.stream()`` and the
google-genai SDK's ``client.models.generate_content_stream()``; what each received."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx2
import orjson

from gateway.chaos import (
    ToolCall,
)

T = TypeVar("T")


@dataclass
class Received:
    """What the client got, assembled from the stream's events as an SDK would."""

    text: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> id, name, arguments
    finish_reasons: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    done: bool = False  # [DONE]; for the Responses API, a response.completed event
    longest_pause: float = 0.0  # seconds between two events: where the stream was rescued
    # The Responses API only: every event's sequence_number, the response ids the events
    # named, the terminal status, and the output text of the SDK's final response.
    sequence: list[int] = field(default_factory=list)
    response_ids: set[str] = field(default_factory=set)
    status: str | None = None
    final_text: str | None = None
    # The Messages API only: each content block's type as it started, the indexes that
    # started and stopped, the thinking and its signature, and the message_stop events.
    # (Its message ids go in response_ids, its stop reasons in finish_reasons.)
    blocks: list[str] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    thinking: str = ""
    signature: str = ""
    stops: int = 0
    # The Gemini API only: each chunk's parts by kind ("thought", "text", "function_call";
    # none: a chunk without parts), the kinds of the parts that carried a thoughtSignature,
    # and the chunks with a finishReason. (Its responseIds go in response_ids, its thoughts
    # in thinking, its finish reasons in finish_reasons, the first call's signature, in
    # base64 as on the wire, in signature.)
    chunks: list[list[str]] = field(default_factory=list)
    signed: list[str] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())]

    def feed(self, data: str) -> str:
        """Take one SSE data payload; return the text it adds."""
        if data == "[DONE]":
            self.done = True
            return ""
        event = orjson.loads(data)
        if "error" in event:
            self.error = event["error"]
            return ""
        text = ""
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish_reasons.append(choice["finish_reason"])
        self.text += text
        return text

    def _tool_delta(self, delta: dict[str, Any]) -> None:
        call = self.calls.setdefault(delta["index"], {"id": "", "name": "", "arguments": ""})
        function = delta.get("function") or {}
        call["id"] += delta.get("id") or ""
        call["name"] += function.get("name") or ""
        call["arguments"] += function.get("arguments") or ""


def timed(events: Iterable[T], received: Received) -> Iterator[T]:
    """``events`` as they come, the longest pause between two of them kept on ``received``."""
    last: float | None = None
    for event in events:
        now = time.perf_counter()
        if last is not None:
            received.longest_pause = max(received.longest_pause, now - last)
        last = now
        yield event


def stream_answer(
    client: httpx2.Client,
    base_url: str,
    model: str,
    show: Callable[[str], None],
    request: Mapping[str, object] | None = None,
) -> Received:
    """Stream one chat completion through the gateway; ``show`` each text delta as it comes.
    ``request``: more fields of the body (``messages``, ``max_tokens``, ``temperature``...)."""
    received = Received()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me how streams survive failure."}],
        "stream": True,
        **(request or {}),
    }
    headers = {"content-type": "application/json"}
    url = base_url + "/chat/completions"
    with client.sse(url, method="POST", content=orjson.dumps(body), headers=headers) as source:
        response = source.response
        if response.status_code != 200:
            response.read()
            received.error = {"message": f"HTTP {response.status_code}: {response.text[:300]}"}
            return received
        for event in timed(iter(source), received):
            if event.data:
                show(received.feed(event.data))
    return received


def stream_response(base_url: str, model: str, show: Callable[[str], None]) -> Received:
    """Stream one Responses API answer with the openai SDK; ``show`` each text delta.

    ``client.responses.stream()`` checks the event order as it goes (one response
    identity, every item added before its events and done before the end); what it
    raises is the stream's error.
    """
    from openai import APIError, OpenAI

    received = Received()
    prompt = "Tell me how streams survive failure."
    with OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30.0) as client:
        try:
            with client.responses.stream(model=model, input=prompt) as events:
                for event in timed(events, received):
                    received.sequence.append(event.sequence_number)
                    response = getattr(event, "response", None)
                    if response is not None:
                        received.response_ids.add(response.id)
                        received.status = response.status
                    if event.type == "response.output_text.delta":
                        received.text += event.delta
                        show(event.delta)
                    elif event.type == "response.completed":
                        received.done = True
                final = events.get_final_response()
                received.final_text = final.output_text
        except APIError as exc:
            received.error = {"message": exc.message, "code": getattr(exc, "code", None)}
        except RuntimeError as exc:  # the SDK's own checks of the event order
            received.error = {"message": str(exc), "code": "sdk_check"}
    return received


MESSAGES_PROMPT = "Tell me how streams survive failure, then look up the weather."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def stream_message(base_url: str, model: str, show: Callable[[str], None]) -> Received:
    """Stream one Messages API answer with the anthropic SDK; ``show`` each text delta.

    Extended thinking on and a tool offered, as an agent asks. ``client.messages.stream()``
    assembles the message as it goes (and raises on an event out of order); an
    ``event: error`` is raised as an ``APIStatusError``.
    """
    from anthropic import Anthropic, APIError

    received = Received()
    with Anthropic(
        base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=30.0
    ) as client:
        try:
            with client.messages.stream(
                model=model,
                max_tokens=4096,
                thinking={"type": "enabled", "budget_tokens": 1024},
                tools=[WEATHER_TOOL],  # type: ignore[list-item]
                messages=[{"role": "user", "content": MESSAGES_PROMPT}],
            ) as events:
                for event in timed(events, received):
                    _message_event(received, event, show)
                final = events.get_final_message()
                received.final_text = "".join(b.text for b in final.content if b.type == "text")
        except APIError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body.get("error")
            code = error.get("type") if isinstance(error, dict) else None
            received.error = {"message": exc.message, "code": code}
        except (RuntimeError, ValueError) as exc:  # the SDK's own checks of the events
            received.error = {"message": str(exc), "code": "sdk_check"}
    return received


def _message_event(received: Received, event: Any, show: Callable[[str], None]) -> None:
    """Note one event of the anthropic SDK's message stream in ``received``."""
    if event.type == "message_start":
        received.response_ids.add(event.message.id)
    elif event.type == "content_block_start":
        received.started.append(event.index)
        received.blocks.append(event.content_block.type)
    elif event.type == "text":
        received.text += event.text
        show(event.text)
    elif event.type == "thinking":
        received.thinking += event.thinking
    elif event.type == "signature":
        received.signature = event.signature
    elif event.type == "content_block_stop":
        received.stopped.append(event.index)
        block = event.content_block
        if block.type == "tool_use":
            arguments = orjson.dumps(block.input).decode()
            received.calls[event.index] = {
                "id": block.id,
                "name": block.name,
                "arguments": arguments,
            }
    elif event.type == "message_delta":
        received.finish_reasons.append(event.delta.stop_reason)
    elif event.type == "message_stop":
        received.stops += 1
        received.done = True


GEMINI_PROMPT = MESSAGES_PROMPT


def stream_gemini(base_url: str, model: str, show: Callable[[str], None]) -> Received:
    """Stream one Gemini API answer with the google-genai SDK; ``show`` each text delta.

    Thoughts asked for (``includeThoughts``) and a function offered, as an agent asks.
    The SDK raises Google's error object (``errors.APIError``), whether it comes as the
    response or, raw, after the stream's events. Its retries are off: the gateway's only.
    """
    from google import genai
    from google.genai import errors, types

    received = Received()
    options = types.HttpOptions(
        base_url=base_url.removesuffix("/v1"),  # the gateway's root: the SDK adds /v1beta
        api_version="v1beta",
        timeout=30_000,  # milliseconds
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    weather = types.FunctionDeclaration(
        name=WEATHER_TOOL["name"],
        description=WEATHER_TOOL["description"],
        parameters_json_schema=WEATHER_TOOL["input_schema"],
    )
    config = types.GenerateContentConfig(
        thinking_config=types.ThinkingConfig(include_thoughts=True),
        tools=[types.Tool(function_declarations=[weather])],
    )
    client = genai.Client(vertexai=False, api_key="unused", http_options=options)
    try:
        stream = client.models.generate_content_stream(
            model=model, contents=GEMINI_PROMPT, config=config
        )
        for chunk in timed(stream, received):
            _gemini_chunk(received, chunk, show)
        received.done = True
    except errors.APIError as exc:
        received.error = {"message": exc.message, "code": exc.status or exc.code}
    finally:
        client.close()
    return received


def _gemini_chunk(received: Received, chunk: Any, show: Callable[[str], None]) -> None:
    """Note one ``GenerateContentResponse`` of the SDK's stream in ``received``."""
    if chunk.response_id:
        received.response_ids.add(chunk.response_id)
    candidate = chunk.candidates[0] if chunk.candidates else None
    content = candidate.content if candidate is not None else None
    kinds = []
    for part in (content.parts if content is not None else None) or []:
        if part.function_call is not None:
            kind = "function_call"
            call = part.function_call
            received.calls[len(received.calls)] = {
                "id": call.id or "",
                "name": call.name or "",
                "arguments": orjson.dumps(call.args or {}).decode(),
            }
        elif part.thought:
            kind = "thought"
            received.thinking += part.text or ""
        else:
            kind = "text"
            received.text += part.text or ""
            show(part.text or "")
        if part.thought_signature:
            received.signed.append(kind)
            if kind == "function_call" and not received.signature:
                received.signature = base64.b64encode(part.thought_signature).decode()
        kinds.append(kind)
    received.chunks.append(kinds)
    if candidate is not None and candidate.finish_reason:
        reason = candidate.finish_reason
        received.finish_reasons.append(getattr(reason, "value", str(reason)))
        received.finished.append(len(received.chunks) - 1)


# -- the evidence: the gateway's metrics, the upstream's recorded requests ---------------

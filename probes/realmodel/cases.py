"""One question, one door, the official SDKs: the unit of every real-model comparison.

    truth = unbroken(llama.url, "chat", "Name three colors.", 60)          # the server itself
    got = through_gateway(gateway.url, "chat", "Name three colors.", 60)   # or raises
    assert got == truth                      # same text, byte for byte, same finish reason

A door is the API a client speaks: ``chat`` (``client.chat.completions.create``),
``responses`` (``client.responses.create``), both with the openai SDK, and
``messages`` (``client.messages.create``, the anthropic SDK). Every request is
greedy (``temperature: 0``, ``seed: 1``), so the same request to the same model
gives the same answer, and streamed (``stream=True``), as the clients the gateway
protects read.

An ``Answer`` is what a client is left with: the text (the concatenated text
deltas) and how it says the answer ended (``finish``): chat's ``finish_reason``,
the Responses API's final ``status`` (with ``incomplete_details.reason``), the
Messages API's ``stop_reason``. Anything that says the stream did not end as a
whole answer does is part of ``finish`` too, so that it can never compare equal to
the truth: a Responses stream without a final response, or whose final output is
not the text its deltas spelled; a Messages stream without ``message_stop``.

An explicit failure raises: the SDKs' own errors (an HTTP error status, a broken
connection, an ``error`` event, which both SDKs raise on), and ``StreamFailed`` for
the Responses API's ``error`` and ``response.failed`` events, which the openai SDK
hands over as events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import anthropic
import openai
from anthropic.types import (
    RawContentBlockDeltaEvent,
    RawMessageDeltaEvent,
    RawMessageStopEvent,
    TextDelta,
)
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseTextDeltaEvent,
)

Door = Literal["chat", "responses", "messages"]
DOORS: tuple[Door, ...] = ("chat", "responses", "messages")
Outcome = Literal["exact", "error", "wrong"]

MODEL = "smollm2"  # llama.cpp serves its one model whatever the name; a gateway routes by it
SEED = 1
TIMEOUT = 120.0  # seconds for a whole answer: 300 tokens take ~5 s, a recovery a few more


class StreamFailed(Exception):
    """The stream ended with an explicit failure event the SDK does not raise on."""


@dataclass(frozen=True)
class Answer:
    """What a client got. Two answers are equal when their text and finish are; the
    events it came in are not compared."""

    text: str
    finish: str | None
    # The text of each event the SDK yielded ("" for one without text): one per SSE
    # event of the stream (chat's ``[DONE]`` aside), one token per event on llama.cpp.
    deltas: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def events(self) -> int:
        return len(self.deltas)

    def prefix(self, events: int) -> str:
        """The text of its first ``events`` events: what a stream cut after that many
        events of this answer had delivered."""
        return "".join(self.deltas[:events])


def ask(
    url: str,
    door: Door,
    prompt: str,
    max_tokens: int,
    *,
    model: str = MODEL,
    timeout: float = TIMEOUT,
) -> Answer:
    """Ask ``prompt`` through ``door`` at ``url`` (a server's or a gateway's root,
    ``http://HOST:PORT``; a trailing ``/v1`` is allowed), streamed and greedy, with at
    most ``max_tokens`` tokens of answer. Raises on an explicit failure."""
    root = url.rstrip("/").removesuffix("/v1")
    if door == "chat":
        return _chat(root, [{"role": "user", "content": prompt}], max_tokens, model, timeout)
    if door == "responses":
        return _responses(root, prompt, max_tokens, model, timeout)
    if door == "messages":
        return _messages(root, prompt, max_tokens, model, timeout)
    raise ValueError(f"unknown door {door!r}")


def unbroken(url: str, door: Door, prompt: str, max_tokens: int) -> Answer:
    """The truth: ``prompt`` asked of the server at ``url`` itself, nothing in between."""
    return ask(url, door, prompt, max_tokens)


def through_gateway(
    base_url: str, door: Door, prompt: str, max_tokens: int, *, model: str = MODEL
) -> Answer:
    """The same question through the gateway at ``base_url`` (its root or ``.../v1``),
    as ``model`` (what its routes match); raises what the client sees as a failure."""
    return ask(base_url, door, prompt, max_tokens, model=model)


def continued(url: str, prompt: str, prefix: str, max_tokens: int) -> str:
    """What the server at ``url`` writes after ``prefix`` given as the final assistant
    message (a literal prefill, chat API): the rest of the answer, if the server itself
    continues exactly."""
    root = url.rstrip("/").removesuffix("/v1")
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": prefix},
    ]
    return _chat(root, messages, max_tokens, MODEL, TIMEOUT).text


def server_drifts(url: str, prompt: str, truth: Answer, events: int) -> bool:
    """Whether the server itself, asked to continue the first ``events`` events of
    ``truth`` (a literal prefill), writes something else than the rest of ``truth``.

    It can: the prefix's tokens are then computed in one batch, not one by one as
    when they were generated, and the last bits of a float can tip a greedy choice
    (measured: 6 continuations in 54, at token boundaries, on llama.cpp's CPU build).
    No gateway could make such an answer exact by prefill; a wrong answer the server
    would not have drifted to is the gateway's."""
    prefix = truth.prefix(events)
    whole = prefix + continued(url, prompt, prefix, len(truth.deltas) + 8)
    return not (whole.startswith(truth.text) or truth.text.startswith(whole))


# llama.cpp's Responses door ends an answer its max_output_tokens cut with
# ``completed``, where OpenAI says ``incomplete``, as the gateway does when it ends
# one whose budget the legs before spent: the same end, in the two words.
_SAME_END = {("completed", "incomplete: max_output_tokens")}


def classify(truth: Answer, got: Answer | BaseException) -> Outcome:
    """``exact`` (byte-equal text, the same finish), ``error`` (the client was told it
    failed) or ``wrong`` (it ended as an answer does, and is not the truth)."""
    if isinstance(got, BaseException):
        return "error"
    if got == truth or (got.text == truth.text and (truth.finish, got.finish) in _SAME_END):
        return "exact"
    return "wrong"


def _openai(root: str, timeout: float) -> openai.OpenAI:
    # No SDK retries: a retry would hide a failure as a fresh answer, and the gateway is
    # what is measured.
    return openai.OpenAI(
        base_url=root + "/v1", api_key="sk-realmodel", max_retries=0, timeout=timeout
    )


def _chat(
    root: str,
    messages: list[ChatCompletionMessageParam],
    max_tokens: int,
    model: str,
    timeout: float,
) -> Answer:
    deltas: list[str] = []
    finish: str | None = None
    with _openai(root, timeout) as client:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            seed=SEED,
            stream=True,
        )
        with stream:
            for chunk in stream:
                deltas.append("".join(choice.delta.content or "" for choice in chunk.choices))
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
    return Answer("".join(deltas), finish, tuple(deltas))


def _responses(root: str, prompt: str, max_tokens: int, model: str, timeout: float) -> Answer:
    deltas: list[str] = []
    finish: str | None = None
    with _openai(root, timeout) as client:
        stream = client.responses.create(
            model=model,
            input=prompt,
            max_output_tokens=max_tokens,
            temperature=0,
            extra_body={"seed": SEED},
            stream=True,
        )
        with stream:
            for event in stream:
                deltas.append(event.delta if isinstance(event, ResponseTextDeltaEvent) else "")
                if isinstance(event, ResponseErrorEvent):
                    raise StreamFailed(f"error event: {event.code}: {event.message}")
                elif isinstance(event, ResponseFailedEvent):
                    error = event.response.error
                    raise StreamFailed(f"response.failed: {error}")
                elif isinstance(event, ResponseCompletedEvent | ResponseIncompleteEvent):
                    response = event.response
                    details = response.incomplete_details
                    finish = str(response.status)
                    if details is not None and details.reason:
                        finish += f": {details.reason}"
                    if response.output_text != "".join(deltas):
                        finish += " (its final output is not the text of its deltas)"
    return Answer("".join(deltas), finish, tuple(deltas))


def _messages(root: str, prompt: str, max_tokens: int, model: str, timeout: float) -> Answer:
    deltas: list[str] = []
    stop_reason: str | None = None
    stopped = False
    # The anthropic SDK no longer takes temperature as an argument; the API still does.
    with anthropic.Anthropic(
        base_url=root, api_key="sk-realmodel", max_retries=0, timeout=timeout
    ) as client:
        stream = client.messages.create(
            model=model,
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": prompt}],
            extra_body={"temperature": 0, "seed": SEED},
            stream=True,
        )
        with stream:
            for event in stream:
                text = ""
                if isinstance(event, RawContentBlockDeltaEvent):
                    if isinstance(event.delta, TextDelta):
                        text = event.delta.text
                elif isinstance(event, RawMessageDeltaEvent):
                    stop_reason = event.delta.stop_reason or stop_reason
                elif isinstance(event, RawMessageStopEvent):
                    stopped = True
                deltas.append(text)
    finish = stop_reason if stopped else f"{stop_reason} (no message_stop)"
    return Answer("".join(deltas), finish, tuple(deltas))

"""``rechunk=1`` and ``sample=1``: the variance of a real model between requests.

A continuation is a new request with its own token boundaries (``rechunk``), and a
sampling model says something else each time (``sample``); each request of a spec
string is its ``attempt``, recorded with what it answered.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.chaos import ChaosUpstream, expected_answer, parse_spec, sampled_answer
from gateway.chaos.answer import attempt_deltas, rechunked, script_for

from .helpers import USER, stream

CONTINUE = {"role": "user", "content": "Continue exactly where you left off."}
RECHUNK = "chaos:text=30,seed=5,rechunk=1"
SAMPLE = "chaos:text=30,seed=5,sample=1"


def _prompt(prefix: str, anchor: str = "") -> list[dict[str, Any]]:
    quoted = f"\n<<<{anchor}>>>" if anchor else ""
    continuation = {"role": "user", "content": CONTINUE["content"] + quoted}
    return [USER, {"role": "assistant", "content": prefix}, continuation]


def _contents(data: list[str]) -> list[str]:
    """The content deltas of a chat stream, one per chunk that has one."""
    deltas = []
    for item in data:
        if item == "[DONE]":
            continue
        for choice in json.loads(item)["choices"]:
            if choice["delta"].get("content"):
                deltas.append(choice["delta"]["content"])
    return deltas


def _bounds(deltas: tuple[str, ...] | list[str], start: int = 0) -> set[int]:
    """The character offsets where the deltas after the first begin."""
    return set(itertools.accumulate((len(d) for d in deltas[:-1]), initial=start))


@pytest.fixture
def sdk(upstream: ChaosUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=upstream.base_url, api_key="chaos", max_retries=0) as client:
        yield client


# -- the spec and the pure functions ------------------------------------------------------


def test_the_keys_parse_as_flags() -> None:
    spec = parse_spec("chaos:rechunk=1,sample=true")
    assert spec.rechunk and spec.sample
    assert not parse_spec("chaos").rechunk and not parse_spec("chaos").sample
    with pytest.raises(ValueError, match="rechunk"):
        parse_spec("chaos:rechunk=2")


@given(text=st.text(min_size=0, max_size=60), count=st.integers(1, 80), seed=st.integers())
def test_rechunked_pieces_rebuild_the_text(text: str, count: int, seed: int) -> None:
    pieces = rechunked(text, count, random.Random(seed))
    assert "".join(pieces) == text
    assert all(pieces)
    assert len(pieces) == (min(count, len(text)) if text else 0)


def test_rechunk_says_the_same_text_split_otherwise_on_every_attempt() -> None:
    spec = parse_spec(RECHUNK)
    text = expected_answer(spec).text
    splits = [attempt_deltas(spec, attempt, "") for attempt in range(6)]
    assert all(deltas is not None and "".join(deltas) == text for deltas in splits)
    assert len({deltas for deltas in splits}) == 6
    assert splits[2] == attempt_deltas(spec, 2, "")  # deterministic
    assert splits[0] != script_for(spec).text_deltas
    # Many cuts fall right next to a multi-byte character, some inside a ZWJ sequence.
    cuts = set().union(*(_bounds(deltas) for deltas in splits if deltas))
    assert any(not text[cut].isascii() or not text[cut - 1].isascii() for cut in cuts)
    assert any(text[cut] == "\u200d" or text[cut - 1] == "\u200d" for cut in cuts)


def test_without_the_keys_the_script_says_its_own_deltas() -> None:
    assert attempt_deltas(parse_spec("chaos"), 3, "") is None


@pytest.mark.parametrize("cut", [1, 7, 40, -3])
def test_a_rechunked_continuation_resumes_at_the_prefix_offset(cut: int) -> None:
    spec = parse_spec(RECHUNK)
    text = expected_answer(spec).text
    prefix = text[:cut]
    continued = [attempt_deltas(spec, attempt, prefix) for attempt in (1, 2)]
    assert all(d is not None and "".join(d) == text[len(prefix) :] for d in continued)
    if len(text) - len(prefix) > 20:  # three characters are one delta on any attempt
        assert continued[0] != continued[1]


def test_sample_says_other_text_on_every_attempt() -> None:
    texts = [sampled_answer(SAMPLE, attempt) for attempt in range(5)]
    assert len(set(texts)) == 5
    assert texts[3] == sampled_answer(parse_spec(SAMPLE), 3)  # deterministic
    length = len(expected_answer(SAMPLE).text)
    assert all(length <= len(text) < length + 40 for text in texts)
    assert any("👩\u200d💻" in text or "你好" in text for text in texts)


def test_a_sampled_continuation_goes_on_after_any_prefix() -> None:
    first = sampled_answer(SAMPLE, 0)
    prefix = first[:25]
    rest = [sampled_answer(SAMPLE, attempt, prefix) for attempt in (1, 2)]
    assert rest[0] != rest[1]
    assert first[25:] not in rest
    assert all(r and r[0] in " \n,.!?;:…|" for r in rest)  # no word glued to the prefix
    # As long as the rest of an answer, and at least one delta after a long prefix.
    assert len(prefix) + len(rest[0]) >= len(expected_answer(SAMPLE).text)
    assert sampled_answer(SAMPLE, 1, "x" * 1000)
    assert sampled_answer("chaos:text=0,sample=1", 1, "a prefix") == ""


# -- the server -----------------------------------------------------------------------------


def test_rechunk_requests_say_the_same_text_in_other_deltas(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    text = expected_answer(RECHUNK).text
    first, second = (stream(client, RECHUNK) for _ in range(2))
    assert first.collect().text == second.collect().text == text
    firsts, seconds = _contents(first.data), _contents(second.data)
    assert firsts != seconds
    # The k-th event of one attempt is not the k-th of the other.
    assert any(a != b for a, b in zip(firsts, seconds, strict=False))
    spec = parse_spec(RECHUNK)
    assert tuple(firsts) == attempt_deltas(spec, 0, "")
    assert tuple(seconds) == attempt_deltas(spec, 1, "")
    recorded = upstream.requests_for(RECHUNK)
    assert [r.attempt for r in recorded] == [0, 1]
    assert [(r.prefix, r.echo, r.answered_text) for r in recorded] == [("", "", text)] * 2


def test_attempts_are_counted_per_spec_string(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    for model in (RECHUNK, RECHUNK + ",pace_ms=0", RECHUNK):
        stream(client, model)
    attempts = [(r.body["model"], r.attempt) for r in upstream.requests]
    assert attempts == [(RECHUNK, 0), (RECHUNK + ",pace_ms=0", 0), (RECHUNK, 1)]


@pytest.mark.parametrize("cut", [1, 12, 41])
def test_a_rechunk_continuation_resumes_at_the_offset_split_anew(
    client: httpx2.Client, upstream: ChaosUpstream, cut: int
) -> None:
    text = expected_answer(RECHUNK).text
    fresh = _contents(stream(client, RECHUNK).data)
    received = stream(client, RECHUNK, _prompt(text[:cut]))
    deltas = _contents(received.data)
    assert "".join(deltas) == text[cut:]
    assert received.collect().finish_reasons == ["stop"]
    # The fresh attempt's boundaries after the cut are not the continuation's.
    fresh_after = {b - cut for b in _bounds(fresh) if b > cut}
    assert fresh_after != _bounds(deltas)
    continuation = upstream.requests_for(RECHUNK)[-1]
    assert (continuation.attempt, continuation.prefix) == (1, text[:cut])
    assert continuation.answered_text == text[cut:]


def test_a_rechunk_continuation_repeats_the_quoted_anchor_first(client: httpx2.Client) -> None:
    text = expected_answer(RECHUNK).text
    received = stream(client, RECHUNK, _prompt(text[:30], anchor=text[20:30]))
    assert received.collect().text == text[20:]


def test_a_reset_then_its_rechunked_continuation_rebuild_the_answer(
    client: httpx2.Client,
) -> None:
    spec = "chaos:text=30,seed=8,rechunk=1,fault=reset,at=9,times=1"
    first = stream(client, spec)
    assert first.error is not None
    prefix = first.collect().text
    assert first.collect().content_deltas == 9
    rest = stream(client, spec, _prompt(prefix))
    assert rest.error is None
    assert prefix + rest.collect().text == expected_answer(spec).text


def test_sample_requests_say_other_text_each(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    texts = [stream(client, SAMPLE).collect().text for _ in range(3)]
    assert texts == [sampled_answer(SAMPLE, attempt) for attempt in range(3)]
    assert len(set(texts)) == 3
    recorded = upstream.requests_for(SAMPLE)
    assert [r.answered_text for r in recorded] == texts
    assert [r.prefix for r in recorded] == [""] * 3


def test_a_sample_continuation_accepts_any_prefix(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    prefix = "Once upon a time, a gateway 你好"
    received = stream(client, SAMPLE, _prompt(prefix))
    assert received.collect().text == sampled_answer(SAMPLE, 0, prefix)
    assert received.collect().finish_reasons == ["stop"]
    recorded = upstream.requests_for(SAMPLE)[-1]
    assert (recorded.prefix, recorded.echo) == (prefix, "")
    assert recorded.answered_text == sampled_answer(SAMPLE, 0, prefix)


@pytest.mark.parametrize(
    ("shape", "extra"),
    [
        ("vllm", {"continue_final_message": True}),
        ("prefix", {}),
    ],
)
def test_a_sample_continuation_reads_the_prefill_shapes(
    client: httpx2.Client, upstream: ChaosUpstream, shape: str, extra: dict[str, Any]
) -> None:
    prefix = "Something else entirely"
    assistant: dict[str, Any] = {"role": "assistant", "content": prefix}
    if shape == "prefix":
        assistant["prefix"] = True
    received = stream(client, SAMPLE, [USER, assistant], **extra)
    assert received.collect().text == sampled_answer(SAMPLE, 0, prefix)
    assert upstream.requests_for(SAMPLE)[-1].prefix == prefix


def test_a_sample_continuation_repeats_the_anchor_then_says_its_own_text(
    client: httpx2.Client, upstream: ChaosUpstream
) -> None:
    first = stream(client, SAMPLE).collect().text
    prefix = first[:33]
    received = stream(client, SAMPLE, _prompt(prefix, anchor=prefix[-9:]))
    recorded = upstream.requests_for(SAMPLE)[-1]
    assert recorded.echo == prefix[-9:]
    assert received.collect().text == prefix[-9:] + sampled_answer(SAMPLE, 1, prefix)
    assert recorded.answered_text == sampled_answer(SAMPLE, 1, prefix)
    assert first[33:] != recorded.answered_text


def test_sample_and_rechunk_together_split_the_sampled_text(client: httpx2.Client) -> None:
    spec = SAMPLE + ",rechunk=1"
    received = stream(client, spec)
    assert received.collect().text == sampled_answer(spec, 0)
    deltas = _contents(received.data)
    assert tuple(deltas) == attempt_deltas(parse_spec(spec), 0, "")


def test_non_streaming_and_legacy_answers_vary_too(client: httpx2.Client) -> None:
    body = {"model": SAMPLE, "messages": _prompt("A prefix")}
    message = client.post("/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["content"] == sampled_answer(SAMPLE, 0, "A prefix")
    legacy = stream(client, RECHUNK, path="/completions")
    texts = [json.loads(d)["choices"][0]["text"] for d in legacy.data if d != "[DONE]"]
    assert "".join(texts) == expected_answer(RECHUNK).text
    assert tuple(t for t in texts if t) == attempt_deltas(parse_spec(RECHUNK), 0, "")


# -- the Responses dialect ------------------------------------------------------------------


def _responses_deltas(sdk: openai.OpenAI, model: str, items: list[Any] | None = None) -> list[str]:
    events = sdk.responses.create(model=model, input=items or [USER], stream=True)
    return [event.delta for event in events if event.type == "response.output_text.delta"]


def test_responses_rechunk_says_the_same_text_in_other_deltas(
    sdk: openai.OpenAI, upstream: ChaosUpstream
) -> None:
    text = expected_answer(RECHUNK).text
    first, second = (_responses_deltas(sdk, RECHUNK) for _ in range(2))
    assert "".join(first) == "".join(second) == text
    assert first != second
    prefix = text[:17]
    items = [USER, {"role": "assistant", "content": prefix}, CONTINUE]
    rest = _responses_deltas(sdk, RECHUNK, items)
    assert "".join(rest) == text[17:]
    assert [r.attempt for r in upstream.requests_for(RECHUNK)] == [0, 1, 2]


def test_responses_sample_continues_any_prefix_with_its_own_text(
    sdk: openai.OpenAI, upstream: ChaosUpstream
) -> None:
    fresh = "".join(_responses_deltas(sdk, SAMPLE))
    assert fresh == sampled_answer(SAMPLE, 0)
    prefix = "Not the chaos answer"
    items = [USER, {"role": "assistant", "content": prefix}, CONTINUE]
    rest = "".join(_responses_deltas(sdk, SAMPLE, items))
    assert rest == sampled_answer(SAMPLE, 1, prefix)
    recorded = upstream.requests_for(SAMPLE)
    assert [(r.prefix, r.answered_text) for r in recorded] == [("", fresh), (prefix, rest)]

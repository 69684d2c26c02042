"""The deterministic answer of a spec, and its deltas pre-encoded for the wire.

An answer is a function of ``(text, reasoning, tools, arg_deltas, seed)`` only, so a
test can compute what an uninterrupted stream says (``expected_answer``) and the
server can recognise a continuation: an assistant prefix of the answer text,
from which it resumes at that character offset.

Every delta is JSON-encoded once per answer (``script_for`` is cached): the
server is the upstream of benchmarks with hundreds of concurrent streams, and
sending a chunk must cost a few byte concatenations, not a JSON encoding.

A real model is not that regular: a continuation is a new request, with its own
token boundaries, and a sampling model says something else each time. Two spec
keys play that, per request ``attempt`` (its number among the requests carrying
the same spec string, 0 for the first; see ``attempt_deltas``):

- ``rechunk=1``: the same text (``expected_answer``), split into deltas at
  boundaries drawn for each attempt (``rechunked``), often right next to a
  multi-byte character or inside a ZWJ sequence, never inside a code point. A
  continuation resumes at the prefix's character offset, re-split too.
- ``sample=1``: each attempt draws its own text after the prefix it continues
  (``sampled_answer``); any assistant prefix is continued, since there is no one
  text it must be a prefix of.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from gateway.chaos.spec import ChaosSpec, parse_spec

# Words a real model emits, mixed to break byte-level handling: 2-, 3- and 4-byte
# UTF-8, and a ZWJ emoji sequence (three code points, one glyph).
_WORDS = (
    "the", "stream", "gateway", "resumes", "every", "token", "after", "a", "reset",
    "model", "answer", "is", "byte", "exact", "and", "recovery", "continues", "where",
    "it", "left", "off", "café", "naïve", "Zürich", "señor", "über", "façade", "crème",
    "Ångström", "你好", "世界", "東京", "数据流", "🌍", "👩‍💻", "🚀", "✨",
)  # fmt: skip
# Every third delta leads with one of these, so even a short answer holds them all.
_TRICKY = ("👩‍💻", "你好", "Zürich", "🌍", "世界", "naïve", "東京", "café", "🚀", "señor", "数据流")
_PUNCTUATION = (",", ".", "!", "?", ";", ":", "…")
_CITIES = ("Zürich 東京", "São Paulo 🌎", "Kraków", "北京", "Montréal", "Reykjavík")

_NO_FINISH = b',"finish_reason":null'
ROLE_BODY = b'{"role":"assistant","content":""}' + _NO_FINISH


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Answer:
    """What an uninterrupted response says, for test assertions."""

    text: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish_reason: str


class Plan(NamedTuple):
    """The deltas of one response: chunk bodies (``delta`` and ``finish_reason`` members)
    and whether each carries content, which is what a fault's ``at=`` counts."""

    bodies: list[bytes]
    counts: list[bool]


@dataclass(frozen=True)
class Script:
    """One answer as deltas, with each delta's chunk body pre-encoded."""

    text: str
    text_deltas: tuple[str, ...]
    starts: tuple[int, ...]  # character offset of each text delta in ``text``
    reasoning_deltas: tuple[str, ...]
    tool_calls: tuple[ToolCall, ...]
    tool_fragments: tuple[tuple[str, ...], ...]  # per call: its arguments, as streamed
    finish_reason: str
    text_bodies: tuple[bytes, ...]
    reasoning_bodies: tuple[bytes, ...]
    tool_bodies: tuple[bytes, ...]  # per call: its header, then its argument fragments
    tool_counts: tuple[bool, ...]
    finish_body: bytes
    legacy_bodies: tuple[bytes, ...]  # /v1/completions: one per text delta, then the finish


# Shapes that repeat, as real answers do: a word said twice, a line of code after
# one like it, a run of spaces, a list of ones. At a seam they are what a guess
# mistakes for an echo (gateway/recovery/seam.py), so every answer has some.
_REPEATS = (
    "\n        }\n    }\n",
    "\n    }\n    }\n",
    " 1, 1, 1,",
    " | | |",
    "        ",
    "\n\n",
    "\n```\nx = 1\nx = 1\n```\n",
)


def _deltas(count: int, salt: str, seed: int) -> tuple[str, ...]:
    # One generator per answer: text=40 starts with the same deltas as text=20.
    rng = random.Random(f"chaos:{salt}:{seed}")
    deltas: list[str] = []
    for index in range(count):
        if index % 3 == 2 and rng.random() < 0.4:
            # A delta said again, or one of the repeating shapes (never in place of
            # a tricky one: those lead every third delta).
            deltas.append(rng.choice((deltas[-1], *_REPEATS)))
            continue
        pieces = []
        for position in range(rng.randint(1, 3)):
            if position and rng.random() < 0.2:
                pieces.append(rng.choice(_PUNCTUATION))
                continue
            word = rng.choice(_WORDS)
            if position == 0 and index % 3 == 1:
                word = _TRICKY[(seed + index // 3) % len(_TRICKY)]
            # Like a real model: the first token has no leading space, the rest do.
            pieces.append(word if index == 0 and position == 0 else " " + word)
        deltas.append("".join(pieces))
    return tuple(deltas)


def _tool_call(index: int, seed: int) -> ToolCall:
    rng = random.Random(f"chaos:tool:{seed}:{index}")
    arguments = {
        "city": _CITIES[(seed + index) % len(_CITIES)],
        "query": " ".join(rng.choice(_WORDS) for _ in range(3)),
        "n": 3 + index,
        "k": index,
    }
    return ToolCall(f"call_{index}_{seed}", f"tool_{index}", orjson.dumps(arguments).decode())


def _fragments(arguments: str, count: int, seed: int) -> list[str]:
    """Split at arbitrary character positions; only the concatenation is valid JSON."""
    count = min(count, len(arguments))  # every fragment holds at least one character
    rng = random.Random(f"chaos:fragments:{seed}:{arguments}")
    bounds = [0, *sorted(rng.sample(range(1, len(arguments)), count - 1)), len(arguments)]
    return [arguments[start:end] for start, end in itertools.pairwise(bounds)]


def _delta_body(delta: dict[str, Any]) -> bytes:
    return orjson.dumps(delta) + _NO_FINISH


def _content_body(text: str) -> bytes:
    return b'{"content":' + orjson.dumps(text) + b"}" + _NO_FINISH


@functools.lru_cache(maxsize=256)
def _script(text: int, reasoning: int, tools: int, arg_deltas: int, seed: int) -> Script:
    text_deltas = _deltas(text, "text", seed)
    reasoning_deltas = _deltas(reasoning, "reasoning", seed)
    calls = tuple(_tool_call(index, seed) for index in range(tools))
    tool_bodies: list[bytes] = []
    tool_counts: list[bool] = []
    tool_fragments = tuple(tuple(_fragments(call.arguments, arg_deltas, seed)) for call in calls)
    for index, call in enumerate(calls):
        function = {"name": call.name, "arguments": ""}
        header = {"index": index, "id": call.id, "type": "function", "function": function}
        tool_bodies.append(_delta_body({"tool_calls": [header]}))
        tool_counts.append(False)
        for fragment in tool_fragments[index]:
            part = {"index": index, "function": {"arguments": fragment}}
            tool_bodies.append(_delta_body({"tool_calls": [part]}))
            tool_counts.append(True)
    starts, offset = [], 0
    for delta in text_deltas:
        starts.append(offset)
        offset += len(delta)
    finish_reason = "tool_calls" if calls else "stop"
    return Script(
        text="".join(text_deltas),
        text_deltas=text_deltas,
        starts=tuple(starts),
        reasoning_deltas=reasoning_deltas,
        tool_calls=calls,
        tool_fragments=tool_fragments,
        finish_reason=finish_reason,
        text_bodies=tuple(_content_body(delta) for delta in text_deltas),
        reasoning_bodies=tuple(_delta_body({"reasoning_content": d}) for d in reasoning_deltas),
        tool_bodies=tuple(tool_bodies),
        tool_counts=tuple(tool_counts),
        finish_body=b'{},"finish_reason":' + orjson.dumps(finish_reason),
        legacy_bodies=tuple(b'"text":' + orjson.dumps(delta) + _NO_FINISH for delta in text_deltas)
        + (b'"text":"","finish_reason":"stop"',),
    )


# What an answer is a function of: (text, reasoning, tools, arg_deltas, seed).
ScriptKey = tuple[int, int, int, int, int]


def script_key(spec: ChaosSpec) -> ScriptKey:
    """``spec``'s answer, as the key a door's cache of its encoded deltas takes."""
    return (spec.text, spec.reasoning, spec.tools, spec.arg_deltas, spec.seed)


def script_for(spec: ChaosSpec | ScriptKey) -> Script:
    return _script(*(spec if isinstance(spec, tuple) else script_key(spec)))


class Encoded(NamedTuple):
    """A script's deltas as one door writes them, each encoded once."""

    reasoning: tuple[bytes, ...]
    text: tuple[bytes, ...]
    fragments: tuple[tuple[bytes, ...], ...]  # per tool call (none: a door sends calls whole)


def encoded(
    script: Script,
    *,
    reasoning: Callable[[str], bytes],
    text: Callable[[str], bytes],
    fragment: Callable[[str], bytes] | None = None,
) -> Encoded:
    """``script``'s reasoning and text deltas and its tool calls' argument fragments, each
    encoded by the door's encoder. A door caches the result per ``ScriptKey``: sending a
    delta is then a concatenation, never a JSON encoding (the module's docstring)."""
    fragments: tuple[tuple[bytes, ...], ...] = ()
    if fragment is not None:
        fragments = tuple(tuple(map(fragment, parts)) for parts in script.tool_fragments)
    return Encoded(
        tuple(map(reasoning, script.reasoning_deltas)),
        tuple(map(text, script.text_deltas)),
        fragments,
    )


def expected_answer(spec: ChaosSpec | str) -> Answer:
    """The answer of an uninterrupted (fresh, fault-free) response to ``spec``."""
    script = script_for(parse_spec(spec) if isinstance(spec, str) else spec)
    return Answer(
        text=script.text,
        reasoning="".join(script.reasoning_deltas),
        tool_calls=list(script.tool_calls),
        finish_reason=script.finish_reason,
    )


def echo_of(spec: ChaosSpec, prefix: str, anchor: str = "") -> str:
    """What a continuation repeats before resuming.

    Like a model that does as asked, the anchor a prompt-mode request quotes (unless
    ``anchor=0``); ``echo_prefix=1`` (a restart) and ``echo=N`` (the last N
    characters) play models that do not.
    """
    if spec.echo_prefix:
        return prefix
    if spec.echo:
        return prefix[-spec.echo :]
    return anchor if spec.anchor else ""


def resume_at(script: Script, prefix: str) -> tuple[str, int]:
    """Where a continuation after ``prefix`` resumes the text: the rest of the delta the
    prefix ends inside ("" on a delta boundary), and the index of the next whole delta."""
    if not prefix:
        return "", 0
    index = bisect.bisect_right(script.starts, len(prefix)) - 1
    consumed = len(prefix) - script.starts[index]
    if not consumed:
        return "", index
    return script.text_deltas[index][consumed:], index + 1


def chat_plan(
    script: Script, prefix: str = "", echo: str = "", deltas: Sequence[str] | None = None
) -> Plan:
    """The chunk bodies of a chat response resuming after ``prefix`` of the answer text.

    Reasoning comes again on a continuation (a real model reasons anew); the text
    resumes mid-delta if the prefix ended there; tool calls always come whole.
    ``deltas`` (``attempt_deltas``), when given, are the text after the prefix.
    """
    bodies = [ROLE_BODY, *script.reasoning_bodies]
    counts = [False] + [True] * len(script.reasoning_bodies)
    if echo:
        bodies.append(_content_body(echo))
        counts.append(True)
    if deltas is not None:
        bodies += [_content_body(delta) for delta in deltas]
        counts += [True] * len(deltas)
    else:
        remainder, index = resume_at(script, prefix)
        if remainder:
            bodies.append(_content_body(remainder))
            counts.append(True)
        bodies += script.text_bodies[index:]
        counts += [True] * (len(script.text_bodies) - index)
    bodies += script.tool_bodies
    counts += script.tool_counts
    bodies.append(script.finish_body)
    counts.append(False)
    return Plan(bodies, counts)


def legacy_plan(script: Script, deltas: Sequence[str] | None = None) -> Plan:
    """The ``text_completion`` chunk bodies: the answer text only (``deltas``, when given),
    then the finish."""
    if deltas is None:
        return Plan(list(script.legacy_bodies), [True] * len(script.text_deltas) + [False])
    bodies = [b'"text":' + orjson.dumps(delta) + _NO_FINISH for delta in deltas]
    return Plan([*bodies, script.legacy_bodies[-1]], [True] * len(deltas) + [False])


# -- what one attempt says: rechunk=1 and sample=1 ----------------------------------------


def rechunked(text: str, count: int, rng: random.Random) -> tuple[str, ...]:
    """``text`` split into ``count`` non-empty deltas (fewer if it is shorter) at code point
    boundaries drawn by ``rng``; half of the cuts, where there are any, right next to a
    non-ASCII character (so inside a ZWJ sequence, or between a CJK word's characters)."""
    if not text:
        return ()
    count = max(1, min(count, len(text)))
    positions = range(1, len(text))
    tricky = [i for i in positions if not (text[i - 1].isascii() and text[i].isascii())]
    cuts = set(rng.sample(tricky, min(len(tricky), (count - 1) // 2)))
    others = [i for i in positions if i not in cuts]
    cuts.update(rng.sample(others, count - 1 - len(cuts)))
    bounds = [0, *sorted(cuts), len(text)]
    return tuple(text[start:end] for start, end in itertools.pairwise(bounds))


def _rechunk(spec: ChaosSpec, attempt: int, prefix: str, text: str) -> tuple[str, ...]:
    """``text`` (what follows ``prefix``) as this attempt splits it: about as many deltas
    as the script has for as much text, give or take 40%."""
    script = script_for(spec)
    rng = random.Random(f"chaos:rechunk:{spec.seed}:{attempt}:{len(prefix)}")
    mean = len(script.text) / max(len(script.text_deltas), 1) or 1.0
    return rechunked(text, round(len(text) / mean * rng.uniform(0.6, 1.4)), rng)


@functools.lru_cache(maxsize=256)
def _sample_pool(count: int, attempt: int, seed: int) -> tuple[str, ...]:
    return _deltas(count, f"sample:{attempt}", seed)


def _sampled(spec: ChaosSpec, attempt: int, prefix: str) -> tuple[str, ...]:
    """The deltas a ``sample=1`` attempt says after ``prefix``: drawn for this attempt,
    until the prefix and they are as long as the script's text (at least one delta)."""
    target = len(script_for(spec).text)
    if not target:
        return ()
    need = max(1, target - len(prefix))
    count = 2 * max(spec.text, 1) + 1
    while True:
        pool = _sample_pool(count, attempt, spec.seed)
        if prefix:  # a continuation: no delta without its leading space
            pool = pool[1:]
        taken: list[str] = []
        length = 0
        for delta in pool:
            taken.append(delta)
            length += len(delta)
            if length >= need:
                return tuple(taken)
        count *= 2  # each delta holds a character at least: this ends


def sampled_answer(spec: ChaosSpec | str, attempt: int, prefix: str = "") -> str:
    """What a ``sample=1`` response says after ``prefix`` (and after any echo) on the
    ``attempt``-th request carrying ``spec`` (0: the first); pure and deterministic."""
    return "".join(_sampled(parse_spec(spec) if isinstance(spec, str) else spec, attempt, prefix))


def attempt_deltas(spec: ChaosSpec, attempt: int, prefix: str) -> tuple[str, ...] | None:
    """The text deltas the ``attempt``-th request of ``spec`` says after ``prefix`` (and its
    echo), or None when they are the script's own (neither ``rechunk`` nor ``sample``)."""
    if spec.sample:
        deltas = _sampled(spec, attempt, prefix)
        return _rechunk(spec, attempt, prefix, "".join(deltas)) if spec.rechunk else deltas
    if spec.rechunk:
        return _rechunk(spec, attempt, prefix, script_for(spec).text[len(prefix) :])
    return None

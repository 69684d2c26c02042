"""The usage of a leg that broke: estimated, because the provider bills it all the same.

A leg that broke before its usage event reported nothing (chat, Responses) or only
its input (Messages' ``message_start``). What the gateway knows of it: the bytes of
the request it sent, and the deltas it received (text, reasoning, tool arguments:
what ``Adapter.delta_chars`` counts, sent to the client or not). So:

- **output tokens**: the deltas received × the output tokens per delta of the run's
  legs that reported usage (same model, same server: OpenAI-compatible servers
  stream about one token per delta, Anthropic a few), else one token per 4
  characters received (the usual rule of thumb for English). Per delta rather than
  per character: a token's length varies far more than the tokens in a delta;
- **input tokens**: what the leg reported, if it did (Messages); else the request's
  bytes × the input tokens per request byte of the run's legs that reported, else
  one token per 4 bytes (an overestimate for a short prompt: its JSON is mostly keys).

An estimate never lowers a count the leg reported. Estimates are kept apart from
reported usage (``RunAccumulator.estimated_by_leg``) and counted apart in the metrics
(``gateway_tokens_total{source="estimated"}``); the client's usage sums both
(``summed``): every field any leg reported is kept, whatever the provider adds next.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4


@dataclass(slots=True)
class LegMeasure:
    """What the gateway saw of one leg."""

    request_bytes: int = 0
    output_chars: int = 0
    output_deltas: int = 0  # chunks that carried some of the answer
    broke: bool = False  # it ended in an interruption, not with its own end


def _rate(pairs: Iterable[tuple[int, int]]) -> float:
    """Tokens per unit (character, byte) over ``(units, tokens)`` pairs, or the default."""
    units = tokens = 0
    for size, count in pairs:
        if size > 0 and count > 0:
            units += size
            tokens += count
    return tokens / units if units else 1 / CHARS_PER_TOKEN


def estimate_usage(
    measure: LegMeasure,
    reported: dict[str, Any] | None,
    complete: Sequence[tuple[LegMeasure, dict[str, Any]]],
    counts: Sequence[str],
) -> dict[str, int] | None:
    """The usage of a leg that broke, in the protocol's ``counts`` (input, output, …).

    ``reported``: what the leg itself reported before it broke; ``complete``: the
    run's legs that reported their usage whole, to calibrate against.
    """
    if not measure.request_bytes and not measure.output_chars:
        return None
    input_name, output_name = counts[0], counts[1]
    usage = {k: _count(reported, k) for k in counts}
    if not usage[input_name]:
        rate = _rate((m.request_bytes, _count(u, input_name)) for m, u in complete)
        usage[input_name] = round(measure.request_bytes * rate)
    calibration = [(m.output_deltas, _count(u, output_name)) for m, u in complete]
    if any(deltas and tokens for deltas, tokens in calibration):
        output = measure.output_deltas * _rate(calibration)
    else:
        output = measure.output_chars / CHARS_PER_TOKEN
    usage[output_name] = max(usage[output_name], round(output))
    total = next((name for name in counts if "total" in name.lower()), None)
    if total is not None:  # chat's total_tokens, Gemini's totalTokenCount
        usage[total] = usage[input_name] + usage[output_name]
    return usage


def output_spent(
    measures: Mapping[int, LegMeasure],
    reported: Mapping[int, dict[str, Any]],
    restored: Mapping[int, dict[str, int]],
    output_name: str,
) -> int:
    """Output tokens the run's legs so far produced: what a continuation's budget is
    the client's less (ARCHITECTURE.md 6b, rule 4).

    A leg that reported its usage counts what it reported. One that broke counts its
    deltas at the run's own tokens per delta where a leg calibrated it, else one token
    per delta, as OpenAI-compatible servers stream (never the characters' estimate, which
    would end an exact prefill continuation early or late); what it reported of its own
    (Messages' running count) is a floor. ``restored``: another replica's estimates for
    the legs it relayed (a takeover).
    """
    calibration = [
        (m.output_deltas, _count(reported[leg], output_name))
        for leg, m in measures.items()
        if not m.broke and leg in reported
    ]
    per_delta = _rate(calibration) if any(d and t for d, t in calibration) else 1.0
    spent = sum(_count(u, output_name) for leg, u in restored.items() if leg not in measures)
    for leg, measure in measures.items():
        own = _count(reported.get(leg), output_name)
        spent += (
            own
            if not measure.broke and leg in reported
            else max(own, math.ceil(measure.output_deltas * per_delta - 1e-9))
        )
    return spent


def summed(legs: Sequence[dict[str, Any]], counts: Sequence[str]) -> dict[str, Any]:
    """The usage of several legs as one: every field any leg reported is kept, numbers
    summed, nested objects (token details) merged field by field, whether the gateway
    knows the field or not (a provider adds counters; an SDK then requires them); lists
    of counts by modality (Gemini's) merged by modality. A value that is not a number
    (a service tier) is the first leg's. ``counts`` (the
    protocol's own totals) are there even where no leg reported them."""
    merged: dict[str, Any] = dict.fromkeys(counts, 0)
    for usage in legs:
        _add(merged, usage)
    return merged


def _add(into: dict[str, Any], usage: dict[str, Any]) -> None:
    for key, value in usage.items():
        if _is_number(value):
            current = into.get(key)
            into[key] = (current if _is_number(current) else 0) + value
        elif isinstance(value, dict):
            current = into.get(key)
            if not isinstance(current, dict):
                current = into[key] = {}
            _add(current, value)
        elif _by_modality(value) and _by_modality(into.get(key)):
            into[key] = _merged_by_modality(into[key], value)
        elif key not in into or into[key] is None:
            into[key] = value


def _by_modality(value: Any) -> bool:
    """Gemini's token details: a list of ``{"modality": …, "tokenCount": n}``."""
    return isinstance(value, list) and all(
        isinstance(item, dict) and "modality" in item for item in value
    )


def _merged_by_modality(into: list[dict[str, Any]], more: list[dict[str, Any]]) -> list[Any]:
    """Two legs' details as one: each modality's counts summed, in first-seen order."""
    merged = {item["modality"]: dict(item) for item in into}
    for item in more:
        current = merged.setdefault(item["modality"], {"modality": item["modality"]})
        _add(current, {k: v for k, v in item.items() if k != "modality"})
    return list(merged.values())


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)  # a bool is not a count


def _count(usage: dict[str, Any] | None, name: str) -> int:
    value = usage.get(name) if usage is not None else None
    return value if type(value) is int and value > 0 else 0

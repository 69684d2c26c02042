"""The PromQL the dashboard's panels use, evaluated over scrapes of ``/metrics``.

Not Prometheus: only what the panels need (selectors with their matchers, ``rate``,
``increase``, ``sum`` with or without ``by``, ``histogram_quantile``, ``/`` between
vectors, parentheses, numbers), parsed by ``promql_parser`` (what
``tests/test_deploy_assets.py`` checks the queries with). Anything else raises
``Unsupported``, so a new panel cannot be drawn wrong in silence.

One simplification, true of the runs drawn here: the gateway is scraped from its start,
so a counter child that a scrape does not show yet counted 0 then; ``increase`` is the
difference between the last scrape in the window and the last one before it (no
extrapolation), ``rate`` that over the window's length.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import promql_parser

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]


class Unsupported(Exception):
    """A query uses PromQL this evaluator does not implement."""


@dataclass(frozen=True)
class Scrape:
    """One scrape: its time (seconds from the first) and every sample, by name and labels."""

    at: float
    samples: Mapping[str, Mapping[Labels, float]]


def _matches(labels: Labels, matchers: list[promql_parser.Matcher]) -> bool:
    values = dict(labels)
    for matcher in matchers:
        value = values.get(matcher.name, "")
        op = matcher.op
        if op == promql_parser.MatchOp.Equal:
            ok = value == matcher.value
        elif op == promql_parser.MatchOp.NotEqual:
            ok = value != matcher.value
        elif op == promql_parser.MatchOp.Re:
            ok = re.fullmatch(matcher.value, value) is not None
        elif op == promql_parser.MatchOp.NotRe:
            ok = re.fullmatch(matcher.value, value) is None
        else:
            raise Unsupported(f"matcher {matcher}")
        if not ok:
            return False
    return True


class Evaluator:
    def __init__(self, scrapes: list[Scrape]) -> None:
        self.scrapes = scrapes

    def _at(self, t: float) -> int:
        """The index of the last scrape at or before ``t`` (-1: none)."""
        found = -1
        for index, scrape in enumerate(self.scrapes):
            if scrape.at <= t + 1e-9:
                found = index
        return found

    def _select(self, selector: promql_parser.VectorSelector, index: int) -> Vector:
        if index < 0 or selector.name is None:
            return {}
        if selector.matchers.or_matchers or selector.offset or selector.at:
            raise Unsupported(f"selector {selector}")
        found = self.scrapes[index].samples.get(selector.name, {})
        return {
            labels: value
            for labels, value in found.items()
            if _matches(labels, selector.matchers.matchers)
        }

    def _increase(self, matrix: promql_parser.MatrixSelector, t: float) -> Vector:
        end = self._select(matrix.vector_selector, self._at(t))
        start = self._select(matrix.vector_selector, self._at(t - matrix.range.total_seconds()))
        return {labels: value - start.get(labels, 0.0) for labels, value in end.items()}

    def evaluate(self, expr: promql_parser.Expr, t: float) -> Vector:
        """The instant vector ``expr`` gives at ``t`` (labels without ``__name__``)."""
        if isinstance(expr, promql_parser.ParenExpr):
            return self.evaluate(expr.expr, t)
        if isinstance(expr, promql_parser.NumberLiteral):
            return {frozenset(): float(expr.val)}
        if isinstance(expr, promql_parser.VectorSelector):
            return self._select(expr, self._at(t))
        if isinstance(expr, promql_parser.Call):
            return self._call(expr, t)
        if isinstance(expr, promql_parser.AggregateExpr):
            return self._aggregate(expr, t)
        if isinstance(expr, promql_parser.BinaryExpr):
            return self._binary(expr, t)
        raise Unsupported(f"{type(expr).__name__}: {expr}")

    def _call(self, call: promql_parser.Call, t: float) -> Vector:
        name = call.func.name
        if name in ("rate", "increase"):
            (matrix,) = call.args
            if not isinstance(matrix, promql_parser.MatrixSelector):
                raise Unsupported(f"{name} of {matrix}")
            increase = self._increase(matrix, t)
            if name == "increase":
                return increase
            seconds = matrix.range.total_seconds()
            return {labels: value / seconds for labels, value in increase.items()}
        if name == "histogram_quantile":
            quantile, buckets = call.args
            return histogram_quantile(float(quantile.val), self.evaluate(buckets, t))
        raise Unsupported(f"function {name}")

    def _aggregate(self, aggregate: promql_parser.AggregateExpr, t: float) -> Vector:
        if str(aggregate.op) != "sum" or aggregate.param is not None:
            raise Unsupported(f"aggregation {aggregate.op}")
        modifier = aggregate.modifier
        groups: dict[Labels, float] = defaultdict(float)
        for labels, value in self.evaluate(aggregate.expr, t).items():
            if modifier is None:
                key: Labels = frozenset()
            elif modifier.type == promql_parser.AggModifierType.By:
                key = frozenset((k, v) for k, v in labels if k in modifier.labels)
            else:
                key = frozenset((k, v) for k, v in labels if k not in modifier.labels)
            groups[key] += value
        return dict(groups)

    def _binary(self, binary: promql_parser.BinaryExpr, t: float) -> Vector:
        if str(binary.op) != "/" or binary.modifier is not None:
            raise Unsupported(f"operator {binary.op}")
        left, right = self.evaluate(binary.lhs, t), self.evaluate(binary.rhs, t)
        if set(right) == {frozenset()} and frozenset() not in left:  # vector / scalar
            return {labels: _divide(value, right[frozenset()]) for labels, value in left.items()}
        return {
            labels: _divide(value, right[labels])
            for labels, value in left.items()
            if labels in right
        }


def _divide(a: float, b: float) -> float:
    return a / b if b else math.nan


def histogram_quantile(quantile: float, buckets: Vector) -> Vector:
    """Prometheus's estimate: linear within the bucket the rank falls in."""
    series: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
    for labels, count in buckets.items():
        values = dict(labels)
        bound = float(values.pop("le"))
        series[frozenset(values.items())].append((bound, count))
    result: Vector = {}
    for labels, points in series.items():
        points.sort()
        total = points[-1][1]
        if not total or not math.isinf(points[-1][0]):
            result[labels] = math.nan
            continue
        rank = quantile * total
        lower, below = 0.0, 0.0
        for bound, count in points:
            if count >= rank:
                if math.isinf(bound):
                    result[labels] = lower
                elif count == below:
                    result[labels] = bound
                else:
                    result[labels] = lower + (bound - lower) * (rank - below) / (count - below)
                break
            lower, below = bound, count
    return result

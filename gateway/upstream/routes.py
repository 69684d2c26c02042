"""Which upstream legs serve a requested model (policy only, no I/O)."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config.schema import (
    Continuation,
    GatewayConfig,
    MinThroughput,
    Retry,
    Route,
    Timeouts,
    Upstream,
)
from gateway.errors import NotFound


@dataclass(frozen=True, slots=True)
class ResolvedLeg:
    upstream: Upstream
    model: str
    timeouts: Timeouts  # the upstream's, with the route's overrides applied
    continuation_override: Continuation | None = None  # the route leg's own

    @property
    def continuation(self) -> Continuation:
        """How this leg continues an answer: the leg's own setting, else the upstream's
        for this model (``continuation_models``), else the upstream's default."""
        if self.continuation_override is not None:
            return self.continuation_override
        for pattern, mode in self.upstream.continuation_models.items():
            if fnmatch.fnmatchcase(self.model, pattern):
                return mode
        return self.upstream.continuation


@dataclass(frozen=True, slots=True)
class ResolvedRoute:
    name: str  # the route's match pattern: a low-cardinality label for metrics and logs
    legs: tuple[ResolvedLeg, ...]
    retry: Retry
    continuation_prompt: str
    continuation_anchor: bool = True
    min_throughput: MinThroughput | None = None  # off unless the route sets one

    def serving(self, protocol: str) -> ResolvedRoute:
        """This route with only the legs whose upstream serves ``protocol``;
        ``NotFound`` naming the route if none does."""
        legs = tuple(leg for leg in self.legs if protocol in leg.upstream.protocols)
        if not legs:
            upstreams = ", ".join(sorted({leg.upstream.name for leg in self.legs}))
            raise NotFound(
                f"No upstream of route {self.name!r} ({upstreams}) serves the {protocol} API; "
                f"list it in the upstream's 'protocols'.",
                code="protocol_not_served",
            )
        return self if len(legs) == len(self.legs) else dataclasses.replace(self, legs=legs)

    def with_fallbacks(self, fallbacks: Sequence[ResolvedLeg]) -> ResolvedRoute:
        """This route with its primary and ``fallbacks`` in place of its own (a request's
        ``fallbacks`` field, api/fields.py)."""
        return dataclasses.replace(self, legs=(self.legs[0], *fallbacks))


# Resolved routes remembered, by model and API: the models clients ask for are few,
# but a client could name endless ones, so the memo is dropped whole when it fills,
# and a name longer than any real model's is resolved without being kept.
RESOLVED_MEMO = 4096
MEMO_MODEL_CHARS = 256


class Router:
    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._routes = config.effective_routes
        self._resolved: dict[tuple[str, str | None], ResolvedRoute] = {}

    def resolve(self, model: object, protocol: str | None = None) -> ResolvedRoute:
        """The first route that matches ``model`` and has a leg serving ``protocol``
        (``chat``, ``responses``, ``messages``); else the first that matches, whose
        ``serving`` then says that it does not serve it.

        Routing is a pure function of the config: each answer is remembered (the
        globs, the legs and their timeouts cost a request start about 8 µs)."""
        if not isinstance(model, str) or not model:
            raise NotFound(
                "The request has no 'model'; name the model to use.", code="model_not_found"
            )
        if len(model) > MEMO_MODEL_CHARS:
            return self._find(model, protocol)
        key = (model, protocol)
        resolved = self._resolved.get(key)
        if resolved is None:
            if len(self._resolved) >= RESOLVED_MEMO:
                self._resolved.clear()
            resolved = self._resolved[key] = self._find(model, protocol)
        return resolved

    def _find(self, model: str, protocol: str | None) -> ResolvedRoute:
        matching = [route for route in self._routes if route.matches(model)]
        if not matching:
            raise NotFound(
                f"The model {model!r} does not exist or no route serves it.",
                code="model_not_found",
            )
        route = next((r for r in matching if self._serves(r, protocol)), matching[0])
        return self._resolve(route, model)

    def _serves(self, route: Route, protocol: str | None) -> bool:
        if protocol is None:
            return True
        upstream = self._config.upstream
        return any(protocol in upstream(leg.upstream).protocols for leg in route.legs)

    def _resolve(self, route: Route, model: str) -> ResolvedRoute:
        legs = tuple(
            self._leg(
                route, self._config.upstream(leg.upstream), leg.model or model, leg.continuation
            )
            for leg in route.legs
        )
        return ResolvedRoute(
            route.match,
            legs,
            route.retry,
            route.continuation_prompt,
            route.continuation_anchor,
            route.min_throughput,
        )

    def literal_models(self) -> list[str]:
        """Route patterns that name one model exactly (no glob characters)."""
        return [r.match for r in self._routes if not any(c in r.match for c in "*?[")]

    def default_leg(self, protocol: str | None = None) -> ResolvedLeg:
        """Where requests without a model go: the primary of the last route (the
        catch-all) with a leg that serves ``protocol``, else of the last route."""
        serving = [route for route in self._routes if self._serves(route, protocol)]
        route = (serving or self._routes)[-1]
        return self._leg(route, self._config.upstream(route.upstream), route.model or "")

    @staticmethod
    def _leg(
        route: Route, upstream: Upstream, model: str, continuation: Continuation | None = None
    ) -> ResolvedLeg:
        timeouts = upstream.timeouts
        if route.timeouts is not None:
            timeouts = route.timeouts.applied_to(timeouts)
        return ResolvedLeg(upstream, model, timeouts, continuation)

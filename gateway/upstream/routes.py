"""Which upstream legs serve a requested model (policy only, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import GatewayConfig, Retry, Route, Upstream
from gateway.errors import NotFound


@dataclass(frozen=True, slots=True)
class ResolvedLeg:
    upstream: Upstream
    model: str


@dataclass(frozen=True, slots=True)
class ResolvedRoute:
    name: str  # the route's match pattern: a low-cardinality label for metrics and logs
    legs: tuple[ResolvedLeg, ...]
    retry: Retry
    continuation_prompt: str


class Router:
    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._routes = config.effective_routes

    def resolve(self, model: object) -> ResolvedRoute:
        if not isinstance(model, str) or not model:
            raise NotFound(
                "The request has no 'model'; name the model to use.", code="model_not_found"
            )
        route = next((r for r in self._routes if r.matches(model)), None)
        if route is None:
            raise NotFound(
                f"The model {model!r} does not exist or no route serves it.",
                code="model_not_found",
            )
        return self._resolve(route, model)

    def _resolve(self, route: Route, model: str) -> ResolvedRoute:
        legs = tuple(
            ResolvedLeg(self._config.upstream(leg.upstream), leg.model or model)
            for leg in route.legs
        )
        return ResolvedRoute(route.match, legs, route.retry, route.continuation_prompt)

    def literal_models(self) -> list[str]:
        """Route patterns that name one model exactly (no glob characters)."""
        return [r.match for r in self._routes if not any(c in r.match for c in "*?[")]

    def default_leg(self) -> ResolvedLeg:
        """Where requests without a model go: the last route's primary (the catch-all)."""
        route = self._routes[-1]
        return ResolvedLeg(self._config.upstream(route.upstream), route.model or "")

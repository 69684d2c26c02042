"""Gateway-only request fields: read by the gateway, never sent upstream.

A strict provider rejects a field it does not know, so every path that forwards a
client's JSON body (a chat run, the ``n > 1`` relay, pass-through) leaves these out.

``fallbacks``: a list of model names that replaces the route's fallback legs for this
request; each is resolved like a request's ``model`` and contributes its route's
primary leg. ``[]`` means no fallbacks; absent or ``null``, the route's own apply.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest, NotFound
from gateway.upstream.routes import ResolvedRoute, Router

GATEWAY_FIELDS = ("fallbacks",)
MAX_FALLBACKS = 8  # each leg has its own retry budget: a long list multiplies requests


class InvalidFallbacks(InvalidRequest):
    code = "invalid_fallbacks"

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["param"] = "fallbacks"
        return body


def without_gateway_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as an upstream may see it (the same dict when it holds none of them)."""
    if not any(field in body for field in GATEWAY_FIELDS):
        return body
    return {k: v for k, v in body.items() if k not in GATEWAY_FIELDS}


def apply_fallbacks(
    route: ResolvedRoute, fallbacks: object, router: Router, protocol: str | None = None
) -> ResolvedRoute:
    """``route`` with a request's ``fallbacks`` field applied; ``InvalidFallbacks`` if bad."""
    if fallbacks is None:
        return route
    if not isinstance(fallbacks, list) or not all(
        isinstance(model, str) and model for model in fallbacks
    ):
        raise InvalidFallbacks("'fallbacks' must be a list of model names.")
    if len(fallbacks) > MAX_FALLBACKS:
        raise InvalidFallbacks(f"'fallbacks' may name at most {MAX_FALLBACKS} models.")
    legs = []
    for index, model in enumerate(fallbacks):
        try:
            legs.append(router.resolve(model, protocol).legs[0])
        except NotFound:
            raise InvalidFallbacks(
                f"fallbacks[{index}]: the model {model!r} does not exist or no route serves it."
            ) from None
    return route.with_fallbacks(legs)

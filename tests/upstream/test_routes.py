"""Routes resolve to legs that carry their effective timeouts (pure: no sockets)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.load import parse_config
from gateway.config.schema import ConfigError, Timeouts
from gateway.upstream.routes import Router

UPSTREAMS = [
    {"name": "a", "base_url": "http://a", "timeouts": {"connect": 1, "first_byte": 10, "idle": 20}},
    {"name": "b", "base_url": "http://b", "timeouts": {"connect": 2, "first_byte": 30, "idle": 40}},
]


def router(*routes: dict[str, Any]) -> Router:
    return Router(parse_config({"upstreams": UPSTREAMS, "routes": list(routes)}))


def test_a_route_overrides_only_the_timeouts_it_sets_on_every_leg() -> None:
    resolved = router(
        {"match": "*", "upstream": "a", "fallbacks": [{"upstream": "b"}], "timeouts": {"idle": 5}}
    ).resolve("m")
    assert [leg.timeouts for leg in resolved.legs] == [
        Timeouts(connect=1, first_byte=10, idle=5),
        Timeouts(connect=2, first_byte=30, idle=5),
    ]


def test_legs_of_a_route_without_timeouts_have_their_upstreams() -> None:
    routes = router(
        {"match": "fast", "upstream": "a", "timeouts": {"first_byte": 2, "connect": 0.5}},
        {"match": "*", "upstream": "a"},
    )
    assert routes.resolve("fast").legs[0].timeouts == Timeouts(connect=0.5, first_byte=2, idle=20)
    assert routes.resolve("other").legs[0].timeouts == Timeouts(connect=1, first_byte=10, idle=20)
    assert routes.default_leg().timeouts == Timeouts(connect=1, first_byte=10, idle=20)


def test_a_bad_route_timeout_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"routes\.0\.timeouts\.idle: .*greater than 0"):
        router({"match": "*", "upstream": "a", "timeouts": {"idle": 0}})
    with pytest.raises(ConfigError, match=r"routes\.0\.timeouts\.stall: Extra inputs"):
        router({"match": "*", "upstream": "a", "timeouts": {"stall": 1}})


def test_remembered_routes_are_the_ones_resolving_gives_and_stay_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    routes = router(
        {"match": "gpt-*", "upstream": "a", "fallbacks": [{"upstream": "b"}]},
        {"match": "*", "upstream": "b"},
    )
    fresh = router(
        {"match": "gpt-*", "upstream": "a", "fallbacks": [{"upstream": "b"}]},
        {"match": "*", "upstream": "b"},
    )
    for model in ("gpt-4o", "other", "gpt-4o", "other"):
        assert routes.resolve(model, "chat") == fresh._find(model, "chat")
    assert routes.resolve("gpt-4o", "chat") is routes.resolve("gpt-4o", "chat")
    # A client naming endless models cannot grow it past its bound...
    monkeypatch.setattr("gateway.upstream.routes.RESOLVED_MEMO", 8)
    for i in range(50):
        assert routes.resolve(f"gpt-{i}", "chat").legs[0].model == f"gpt-{i}"
        assert len(routes._resolved) <= 8
    # ...nor keep a huge name: resolved, not remembered.
    huge = "gpt-" + "x" * 10_000
    assert routes.resolve(huge, "chat").legs[0].model == huge
    assert all(model != huge for model, _ in routes._resolved)

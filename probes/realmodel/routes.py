"""The gateway in front of the real-model servers: A first, B the fallback, one route
per continuation mode, picked by the client's model name.

    config = gateway_config(proxy.url, llama_b.url)        # A behind a CuttingProxy
    with running_gateway(config) as gateway:               # tests.servers
        through_gateway(gateway.url, "chat", prompt, 60, model=model_for("vllm"))

``smollm2`` is the route whose mode is left unset (each upstream's default for its
kind: ``Upstream.continuation`` in gateway/config/schema.py); ``smollm2-MODE`` sets MODE on
every leg (a route's ``continuation`` is its primary leg's only). Each mode has two
routes: the first, of OpenAI upstreams, serves the chat and Responses doors; the
second, of Anthropic upstreams on the same servers (llama.cpp serves ``/v1/messages``
as Anthropic does), the Messages door, which skips the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from gateway.config.load import parse_config
from gateway.config.schema import Continuation, GatewayConfig
from probes.realmodel.cases import MODEL

Mode = Literal["unset"] | Continuation  # unset: the upstream's own default
MODES: tuple[Mode, ...] = ("unset", "vllm", "prompt")
TIMEOUTS = {"connect": 2, "first_byte": 30, "idle": 10}
# Retries at once: a dead server is found dead in milliseconds, the fallback is next.
RETRY = {"retries": 2, "backoff_initial": 0, "backoff_max": 0, "idle_retry_delay": 0}


def model_for(mode: Mode) -> str:
    """The client's model name that picks ``mode``'s routes."""
    return MODEL if mode == "unset" else f"{MODEL}-{mode}"


def gateway_config(
    a_url: str, b_url: str, *, modes: Sequence[Mode] = MODES, **overrides: Any
) -> GatewayConfig:
    """Upstream A at ``a_url`` first, B at ``b_url`` as the fallback (servers' roots,
    ``http://HOST:PORT``), routes for ``modes``; ``overrides`` are more top-level keys
    (``state``, ``limits``...)."""
    # No circuit breaking: a kill must not send the cases after it to B without a fault.
    common: dict[str, Any] = {"timeouts": TIMEOUTS, "circuit": {"failures": 0}}
    upstreams = [
        {"name": "a", "base_url": a_url + "/v1", **common},
        {"name": "b", "base_url": b_url + "/v1", **common},
        {"name": "a-messages", "kind": "anthropic", "base_url": a_url, **common},
        {"name": "b-messages", "kind": "anthropic", "base_url": b_url, **common},
    ]
    routes = []
    for mode in modes:
        mode_key = {} if mode == "unset" else {"continuation": mode}
        for primary, fallback in (("a", "b"), ("a-messages", "b-messages")):
            routes.append(
                {
                    "match": model_for(mode),
                    "upstream": primary,
                    **mode_key,
                    "fallbacks": [{"upstream": fallback, **mode_key}],
                    "retry": RETRY,
                }
            )
    data = {"upstreams": upstreams, "routes": routes, **overrides}
    return parse_config(data, "probes.realmodel")

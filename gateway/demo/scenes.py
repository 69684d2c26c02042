"""The demo's scenes: what the chaos upstream breaks, and the gateway in front of it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.app import create_app
from gateway.chaos.clouds import BEDROCK_CREDENTIALS
from gateway.config.load import parse_config
from gateway.config.schema import GatewayConfig
from gateway.metrics import Metrics
from gateway.serve import in_thread

IDLE_TIMEOUT = 1.0  # seconds without a byte before the gateway calls a stream stalled
PACE_MS = 35  # between the upstream's deltas, so the answers arrive as a model's would


CHAT, RESPONSES, MESSAGES, GEMINI = "chat", "responses", "messages", "gemini"


@dataclass(frozen=True)
class Scenario:
    title: str  # what breaks, and where
    spec: str  # the chaos model name, without pacing; times=1: only the first request breaks
    rescuable: bool = True
    # Chat completions (httpx2), the Responses API (the openai SDK), the Anthropic
    # Messages API (the anthropic SDK), or the Gemini API (the google-genai SDK).
    api: str = CHAT
    needs: str = ""  # a package its gateway needs besides the SDK: botocore (Bedrock)


SCENARIOS = (
    Scenario(
        "Connection reset (TCP RST) after 12 of 32 text deltas",
        "chaos:text=32,fault=reset,at=12,times=1",
    ),
    Scenario(
        f"The upstream goes silent after 18 of 32 text deltas (idle timeout: {IDLE_TIMEOUT:g} s)",
        "chaos:text=32,seed=1,fault=stall,at=18,times=1",
    ),
    Scenario(
        "An in-band error event (503, upstream overloaded) after 8 of 32 text deltas; "
        "the continuation repeats the last words it was asked to quote back",
        "chaos:text=32,seed=2,fault=error,at=8,times=1",
    ),
    Scenario(
        "The body ends with [DONE] but without a finish_reason after 20 of 32 text deltas "
        "(a silent truncation)",
        "chaos:text=32,seed=3,fault=no_finish,at=20,times=1",
    ),
    Scenario(
        "Connection reset after 8 text deltas, while tool_0's JSON arguments are half-written "
        "(3 of 6 fragments)",
        "chaos:text=8,tools=2,arg_deltas=6,seed=4,fault=reset,at=11,times=1",
    ),
    Scenario(
        "A content-policy error event after 10 of 32 text deltas: not transient, so not retried",
        "chaos:text=32,seed=5,fault=error_fatal,at=10,times=1",
        rescuable=False,
    ),
    Scenario(
        "The Responses API, through the openai SDK's client.responses.stream(): connection "
        "reset after 12 of 32 text deltas",
        "chaos:text=32,seed=6,fault=reset,at=12,times=1",
        api=RESPONSES,
    ),
    Scenario(
        "The Anthropic Messages API, through the anthropic SDK's client.messages.stream(), "
        "with extended thinking and a tool: an overloaded_error event after the thinking and "
        "12 of 32 text deltas",
        "chaos:text=32,reasoning=8,tools=1,seed=8,fault=error,at=20,times=1",
        api=MESSAGES,
    ),
    Scenario(
        "Anthropic answers overloaded_error after 14 of 32 text deltas, every time; the "
        "answer is finished on Amazon Bedrock, the same model behind SigV4 and AWS event "
        "stream framing",
        "chaos:text=32,reasoning=8,tools=1,seed=9,fault=error,at=22",
        api=MESSAGES,
        needs="botocore",
    ),
    Scenario(
        "The Gemini API, through the google-genai SDK's client.models.generate_content_stream(), "
        "with thoughts and a function call: Google's raw UNAVAILABLE error object after the "
        "thoughts and 12 of 32 text deltas",
        # at= counts the 8 thought chunks (the request asks includeThoughts), then the text.
        "chaos:text=32,reasoning=8,tools=1,seed=10,fault=error,at=20,times=1",
        api=GEMINI,
    ),
)
# The Bedrock scene's route: Anthropic first with no retry, then the same answer on
# Bedrock (its own model id there: the same spec without the fault).
BEDROCK_SCENE = next(s.spec for s in SCENARIOS if s.needs == "botocore")
BEDROCK_MODEL = BEDROCK_SCENE.removesuffix(",fault=error,at=22")


# -- the servers ---------------------------------------------------------------------


def demo_config(upstream_url: str, bedrock: bool = True) -> GatewayConfig:
    """The chaos upstream four times (its OpenAI APIs, its Messages API as an
    ``anthropic`` upstream, its Gemini API as a ``gemini`` one, and as a ``bedrock`` one,
    with the keys its Bedrock door takes), short timeouts and a short retry backoff,
    quiet logs, memory state. ``bedrock``: botocore is installed (the ``bedrock`` extra)."""
    retry = {"retries": 2, "backoff_initial": 0.05, "backoff_max": 0.2, "idle_retry_delay": 0}
    timeouts = {"connect": 2, "first_byte": 5, "idle": IDLE_TIMEOUT}
    [(key_id, secret)] = BEDROCK_CREDENTIALS.items()
    clouds: list[dict[str, object]] = []
    routes: list[dict[str, object]] = []
    if bedrock:
        clouds.append(
            {
                "name": "chaos-bedrock",
                "kind": "bedrock",
                "region": "us-east-1",
                "base_url": upstream_url.removesuffix("/v1"),
                "aws_access_key_id": key_id,
                "aws_secret_access_key": secret,
                "timeouts": timeouts,
            }
        )
        routes.append(
            {
                "match": BEDROCK_SCENE + "*",
                "upstream": "chaos-anthropic",
                "retry": retry | {"retries": 0},
                "fallbacks": [{"upstream": "chaos-bedrock", "model": BEDROCK_MODEL}],
            }
        )
    data = {
        "upstreams": [
            {"name": "chaos", "base_url": upstream_url, "timeouts": timeouts},
            {
                "name": "chaos-anthropic",
                "kind": "anthropic",
                # As the anthropic SDK takes it: the server's root, without /v1.
                "base_url": upstream_url.removesuffix("/v1"),
                "timeouts": timeouts,
            },
            {
                "name": "chaos-gemini",
                "kind": "gemini",
                # The API root with its version, as Google's; the client's key passes.
                "base_url": upstream_url.removesuffix("/v1") + "/v1beta",
                "timeouts": timeouts,
            },
            *clouds,
        ],
        # A request takes the first route that serves its API: /v1/messages the first,
        # the Gemini API the second, the rest (and requests without a model) the third.
        "routes": [
            *routes,
            {"match": "*", "upstream": "chaos-anthropic", "retry": retry},
            {"match": "*", "upstream": "chaos-gemini", "retry": retry},
            {"match": "*", "upstream": "chaos", "retry": retry},
        ],
        "logging": {"level": "error"},
    }
    return parse_config(data, "demo config")


@contextlib.contextmanager
def running_gateway(config: GatewayConfig, metrics: Metrics) -> Iterator[str]:
    """Serve the gateway in a daemon thread on a free port; yield its /v1 URL."""
    with in_thread(create_app(config, metrics)) as url:
        yield url + "/v1"


# -- the client ----------------------------------------------------------------------

"""The configuration's schema: every key, its type, its default and its checks.

Read by ``gateway.config.load`` (a YAML file with ``${ENV}`` interpolation, or the
embedded defaults). Secrets are ``SecretStr`` so that a stray ``repr`` or log line
never shows them; ``describe()`` (``gateway.describe``) masks them too.

Past 450 lines on purpose: this is the configuration reference (docs/configuration.md
is generated from these models, in this order), and it reads as a config file does,
top to bottom; loading, interpolation and the embedded defaults are in ``load.py``.
"""

from __future__ import annotations

import fnmatch
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

ENV_PREFIX = "GATEWAY_"
DEFAULT_UPSTREAM_URL = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_URL = "https://api.anthropic.com"
DEFAULT_GEMINI_URL = "https://generativelanguage.googleapis.com/v1beta"
GEMINI_VERSIONS = ("/v1", "/v1beta", "/v1alpha")

# auto: learned per upstream and model (an OpenAI-compatible upstream's default): the
# self-hosted servers that continue a final assistant message literally are continued
# so (vllm), any other in prompt mode (gateway/upstream/continuation.py).
# replay: no continuation, the request again, verified (exact on any deterministic server).
Continuation = Literal[
    "auto", "prompt", "prefill", "vllm", "prefix", "prefix_echo", "replay", "none"
]
# The streaming APIs an upstream serves: OpenAI, vLLM, Ollama and OpenRouter serve
# chat and responses; a server with chat completions only says ["chat"]; Anthropic
# (and Anthropic-compatible servers) serve messages; Google's Gemini API (the Developer
# API, Vertex AI) serves gemini.
Protocol = Literal["chat", "responses", "messages", "gemini"]
# How an upstream takes its key and where its API lives: OpenAI's way (Authorization:
# Bearer, base_url up to /chat/completions), or Anthropic's (x-api-key and
# anthropic-version, base_url as the anthropic SDK takes it: up to /v1/messages); the
# same models on other clouds: Claude on Amazon Bedrock (SigV4) and Google Vertex AI
# (OAuth), OpenAI's models on Azure OpenAI (api-key); Gemini on Google's Gemini Developer
# API (x-goog-api-key) and on Vertex AI. docs/providers.md.
UpstreamKind = Literal["openai", "anthropic", "bedrock", "vertex", "azure", "gemini"]
ANTHROPIC_VERSION = "2023-06-01"
# Kinds that speak the Anthropic Messages API, in their own framing and auth.
MESSAGES_KINDS = frozenset({"anthropic", "bedrock", "vertex"})
PROXY_SCHEMES = ("http://", "https://")  # an HTTP proxy (https: TLS to the proxy itself)


class ConfigError(Exception):
    """The configuration cannot be used; the message says where and why."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Listen(_Model):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # On SIGTERM: stop accepting, give running streams this long to finish, then
    # checkpoint the rest and end their client streams with a resumable error.
    drain_timeout: float = Field(default=25.0, ge=0)
    # A client must send a request's head within this long of connecting (or of the
    # first byte of its next request); its body may not go silent for this long.
    header_timeout: float = Field(default=15.0, gt=0)
    body_timeout: float = Field(default=30.0, gt=0)
    # A client that accepts no bytes of its response for this long, while some wait
    # for it, is disconnected (nginx's send_timeout): a stream it stopped reading goes
    # on as a detached run, which it can resume.
    send_timeout: float = Field(default=30.0, gt=0)


class Logging(_Model):
    level: Literal["debug", "info", "warning", "error"] = "info"
    # auto: plain text when stderr is a terminal, else one JSON object per line.
    format: Literal["auto", "json", "text"] = "auto"
    # Prompts and completions in the request log lines (never keys). Debugging only.
    content: bool = False


class Tracing(_Model):
    """OpenTelemetry traces over OTLP/HTTP (docs/tracing.md). The exporter, sampler and
    resource also read the standard OTEL_* environment variables."""

    # Unset: on when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set;
    # true: on (default endpoint http://localhost:4318); false: off whatever the env.
    enabled: bool | None = None
    # The collector's OTLP/HTTP base URL (/v1/traces is appended); unset: the env's.
    endpoint: str | None = Field(default=None, pattern=r"^https?://")
    service_name: str | None = None  # unset: OTEL_SERVICE_NAME, else resumable-gateway
    # Prompts and answers in spans (gen_ai.input.messages, gen_ai.output.messages);
    # unset: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT. Never credentials.
    capture_content: bool | None = None


class Timeouts(_Model):
    connect: float = Field(default=5.0, gt=0, description="TCP + TLS connect, seconds")
    first_byte: float = Field(
        default=60.0, gt=0, description="until response headers and first event"
    )
    idle: float = Field(default=60.0, gt=0, description="longest silence once the stream started")


class TimeoutOverrides(_Model):
    """A route's timeouts: each one set replaces the upstream's for that route's requests."""

    connect: float | None = Field(default=None, gt=0)
    first_byte: float | None = Field(default=None, gt=0)
    idle: float | None = Field(default=None, gt=0)

    def applied_to(self, timeouts: Timeouts) -> Timeouts:
        update = {k: v for k, v in self.model_dump().items() if v is not None}
        return timeouts.model_copy(update=update) if update else timeouts


class Circuit(_Model):
    """Circuit breaking for one upstream (docs/recovery.md)."""

    # Failures in a row (connect error, 5xx/529, first-byte timeout, broken stream)
    # that open the circuit; 0 disables circuit breaking for the upstream.
    failures: int = Field(default=5, ge=0)
    cooldown: float = Field(default=30.0, gt=0)  # seconds skipped before one probe


def _parses(url: str) -> bool:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - a password with a bare "/" leaves "user:pa" as host:port
    except ValueError:
        return False
    return bool(parts.hostname)


class Tls(_Model):
    """How an upstream's TLS is checked (docs/configuration.md, "Networks")."""

    # A PEM bundle of the CAs to trust (a private vLLM, a TLS-inspecting proxy); unset:
    # SSL_CERT_FILE / SSL_CERT_DIR when set, else the system trust store (as httpx2).
    ca_file: str | None = None
    client_cert: str | None = None  # PEM certificate for mutual TLS (with client_key)
    client_key: str | None = None  # its key; unset: in client_cert's file
    verify: bool = True  # false: no certificate check at all (warned at start-up)

    @model_validator(mode="after")
    def _key_needs_cert(self) -> Tls:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs a client_cert")
        return self


Engine = Literal["auto", "builtin", "httpx"]


class Upstream(_Model):
    name: str = Field(min_length=1)
    kind: UpstreamKind = "openai"
    # openai: up to, not including, /chat/completions (https://api.openai.com/v1);
    # anthropic: up to, not including, /v1/messages (https://api.anthropic.com);
    # gemini: up to, not including, /models, with the API version (default:
    # https://generativelanguage.googleapis.com/v1beta).
    base_url: str = Field(pattern=r"^https?://")
    api_key: SecretStr | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    # anthropic: sent when the client sends no anthropic-version of its own.
    anthropic_version: str = ANTHROPIC_VERSION
    timeouts: Timeouts = Timeouts()
    # Default: auto (learned from the server: prefill where it is vLLM, SGLang or
    # llama.cpp, else prompt); prompt on azure; prefill on an anthropic or gemini
    # upstream (a model that refuses it is continued in prompt mode from then on).
    continuation: Continuation = "auto"
    # bedrock and vertex: the cloud region (us-east-1; us-east5, europe-west1 or global);
    # its endpoint is the default base_url. Credentials come from the standard chains:
    # AWS's (environment, profile, role) and Google's application default credentials.
    region: str | None = None
    project: str | None = None  # vertex: the Google Cloud project
    # bedrock: a profile of the shared AWS config, or keys of its own; unset: the chain
    # (AWS_ACCESS_KEY_ID..., AWS_PROFILE, the shared config, a container or instance role).
    aws_profile: str | None = None
    aws_access_key_id: SecretStr | None = None
    aws_secret_access_key: SecretStr | None = None
    aws_session_token: SecretStr | None = None
    # bedrock: the anthropic-beta flags it is sent (Bedrock refuses flags it does not
    # know, e.g. some Claude Code sends); unset: every flag the client sends.
    anthropic_betas: list[str] | None = None
    # azure: the api-version of the deployments URL form (base_url up to the resource,
    # https://NAME.openai.azure.com; the leg's model is the deployment). Unset: the v1
    # form, base_url up to /openai/v1, the deployment in the body's model.
    api_version: str | None = None
    # Continuation is a property of the model: globs of model names (first match
    # wins) with their own mode, e.g. {"claude-*": prompt} on an upstream whose
    # default is prefix. A leg's own `continuation` wins over both.
    continuation_models: dict[str, Continuation] = Field(default_factory=dict)
    # Responses requests the client lets the upstream store (no ``store: false``) asked
    # as background responses, so that a cut stream is re-attached to the same
    # generation (``GET /responses/{id}?stream=true&starting_after=N``) before any
    # continuation. Unset: on for OpenAI's own API (api.openai.com) and azure, whose
    # Responses APIs keep background responses; off for other OpenAI-compatible servers,
    # which may not (docs/recovery.md, "The provider's own resume").
    background: bool | None = None
    circuit: Circuit = Circuit()
    # Default: ["chat", "responses"]; ["messages"] on an anthropic, bedrock or vertex
    # upstream; ["gemini"] on a gemini one. A vertex upstream serves Claude (messages),
    # Gemini (gemini), or both.
    protocols: list[Protocol] = Field(default=["chat", "responses"], min_length=1)
    # Unset: HTTPS_PROXY / HTTP_PROXY / ALL_PROXY and NO_PROXY, as curl reads them; a URL
    # (http://user:pass@proxy:3128): that proxy; null: direct, whatever the environment.
    proxy: SecretStr | None = None
    tls: Tls = Tls()
    http2: bool = False  # HTTP/2 (over TLS, by ALPN) instead of HTTP/1.1
    # auto: the gateway's own HTTP/1.1 engine, directly or through an http:// proxy (the
    # fastest: BENCHMARKS.md, "Upstream HTTP engines"); httpx2's (httpcore2) over HTTP/2
    # or through an https:// proxy. builtin, httpx: that one.
    engine: Engine = "auto"

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_known(cls, value: Any) -> Any:
        if value == "aiohttp":
            raise ValueError(
                "engine aiohttp is no longer offered: httpx-aiohttp works with httpx, not with "
                "httpx2, which the gateway is built on; use auto (or builtin, httpx)"
            )
        return value

    @field_validator("proxy")
    @classmethod
    def _proxy_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        url = value.get_secret_value()
        if not url.startswith(PROXY_SCHEMES):
            raise ValueError(f"expected a URL starting with one of {', '.join(PROXY_SCHEMES)}")
        if not _parses(url):  # the value is never echoed: it holds credentials
            raise ValueError("not a valid URL (percent-encode reserved characters in it)")
        return value

    @model_validator(mode="after")
    def _engine_can(self) -> Upstream:
        if self.engine == "builtin" and self.http2:
            raise ValueError("engine builtin speaks HTTP/1.1 only; use auto or httpx for http2")
        proxy = self.proxy.get_secret_value() if self.proxy is not None else ""
        if self.engine == "builtin" and proxy.startswith("https://"):
            raise ValueError("engine builtin cannot use an https:// proxy; use auto or httpx")
        return self

    @property
    def proxied(self) -> bool:
        """Whether a proxy is configured for it (not from the environment)."""
        return "proxy" in self.model_fields_set and self.proxy is not None

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):  # ${KEY:-} left empty: as if not set
            data = {k: v for k, v in data.items() if not (k in ("api_key", "proxy") and v == "")}
        if not isinstance(data, dict):
            return data
        kind = data.get("kind")
        if kind == "azure":  # OpenAI's own models: no prefill to learn
            data = {"continuation": "prompt"} | data
        if kind in MESSAGES_KINDS:
            defaults = {"protocols": ["messages"], "continuation": "prefill"}
            data = defaults | data
        elif kind == "gemini":
            defaults = {
                "protocols": ["gemini"],
                "continuation": "prefill",
                "base_url": DEFAULT_GEMINI_URL,
            }
            data = defaults | data
        region = data.get("region")
        if kind in ("bedrock", "vertex") and not region:
            raise ValueError(f"kind {kind} needs a region")
        if "base_url" not in data and isinstance(region, str) and region:
            if kind == "bedrock":
                data = data | {"base_url": f"https://bedrock-runtime.{region}.amazonaws.com"}
            elif kind == "vertex":
                host = "aiplatform.googleapis.com"
                host = host if region == "global" else f"{region}-{host}"
                data = data | {"base_url": f"https://{host}/v1"}
        return data

    @model_validator(mode="after")
    def _kind_needs(self) -> Upstream:
        if self.kind == "vertex" and not self.project:
            raise ValueError("kind vertex needs a project")
        keys = (self.aws_access_key_id is None, self.aws_secret_access_key is None)
        if keys[0] != keys[1]:
            raise ValueError("aws_access_key_id and aws_secret_access_key go together")
        aws = self.aws_profile is not None or not keys[0] or self.aws_session_token is not None
        if (aws or self.anthropic_betas is not None) and self.kind != "bedrock":
            raise ValueError("aws_* and anthropic_betas settings are for kind bedrock")
        if self.region is not None and self.kind not in ("bedrock", "vertex"):
            raise ValueError("region is for kinds bedrock and vertex")
        if self.project is not None and self.kind != "vertex":
            raise ValueError("project is for kind vertex")
        if self.api_version is not None and (self.kind != "azure" or self.root.endswith("/v1")):
            raise ValueError(
                "api_version is for kind azure's deployments form (base_url up to the resource)"
            )
        if self.kind in ("bedrock", "vertex") and self.api_key is not None:
            cloud = "AWS" if self.kind == "bedrock" else "Google application default"
            raise ValueError(
                f"kind {self.kind} takes no api_key: it signs with {cloud} credentials"
            )
        if (
            self.kind == "azure"
            and self.api_version is None
            and not self.root.endswith("/openai/v1")
        ):
            raise ValueError(
                "kind azure needs base_url up to /openai/v1, or api_version for the "
                "deployments form (base_url up to the resource)"
            )
        if self.background and self.kind not in ("openai", "azure"):
            raise ValueError("background is for kinds openai and azure (the Responses API)")
        if self.kind == "bedrock" and self.protocols != ["messages"]:
            raise ValueError("kind bedrock serves protocols [messages] only")
        if self.kind == "vertex" and not set(self.protocols) <= {"messages", "gemini"}:
            raise ValueError("kind vertex serves protocols messages (Claude) and gemini only")
        if self.kind == "gemini" and self.protocols != ["gemini"]:
            raise ValueError("kind gemini serves protocols [gemini] only")
        if "gemini" in self.protocols and self.kind not in ("gemini", "vertex"):
            raise ValueError("protocol gemini is served by kinds gemini and vertex")
        return self

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")

    @property
    def runs_background(self) -> bool:
        """Whether its stored Responses requests go as background responses
        (``background``; unset: OpenAI's own API and Azure)."""
        if self.background is not None:
            return self.background
        if self.kind == "azure":
            return True
        return self.kind == "openai" and urlsplit(self.base_url).hostname == "api.openai.com"

    @property
    def api_root(self) -> str:
        """What API paths go under (``/chat/completions``, ``/messages``, ``/models``):
        an anthropic upstream's base URL is the SDK's, without the ``/v1``; a gemini
        upstream's without a version gets ``/v1beta``, the Gemini SDKs' own."""
        root = self.root
        if self.kind == "anthropic" and not root.endswith("/v1"):
            return root + "/v1"
        if self.kind == "gemini" and not root.endswith(GEMINI_VERSIONS):
            return root + "/v1beta"
        return root


class Leg(_Model):
    upstream: str
    model: str | None = Field(
        default=None, description="model sent upstream; default: the client's"
    )
    continuation: Continuation | None = None  # default: the upstream's, by model


DEFAULT_CONTINUATION_PROMPT = (
    "Your previous message was cut off. Continue it exactly where it stopped, without "
    "a preamble, in the same language and format."
)


class Retry(_Model):
    # Retries per leg after the first attempt; an interruption uses one.
    retries: int = Field(default=2, ge=0, le=10)
    backoff_initial: float = Field(default=0.5, ge=0)  # seconds, doubled per attempt, jittered
    backoff_max: float = Field(default=8.0, ge=0)
    retry_after_max: float = Field(default=30.0, ge=0)  # cap on an upstream's Retry-After
    idle_retry_delay: float = Field(default=0.2, ge=0)  # after an idle stall


class MinThroughput(_Model):
    """The slowest a route's stream may be before it moves to the next leg
    (docs/recovery.md): characters of content, reasoning and tool-call arguments per second
    over the last ``window`` seconds, checked from ``grace`` seconds after the leg's
    first event. Silence is the idle timeout's business, not this."""

    chars_per_s: float = Field(gt=0)
    window: float = Field(default=5.0, gt=0)
    grace: float = Field(default=10.0, ge=0)


class Route(_Model):
    match: str = Field(min_length=1)  # a model name or a glob, e.g. gpt-4o*
    upstream: str
    model: str | None = None
    continuation: Continuation | None = None  # the primary leg's; default: the upstream's
    fallbacks: list[Leg] = Field(default_factory=list)
    retry: Retry = Retry()
    continuation_prompt: str = Field(default=DEFAULT_CONTINUATION_PROMPT, min_length=1)
    # Override the upstreams' timeouts for this route's requests, on every leg.
    timeouts: TimeoutOverrides | None = None
    # Ask prompt-mode legs to begin with the text's quoted last words, cut exactly at
    # the seam; false: only a restart from the beginning is recognised and cut.
    continuation_anchor: bool = True
    # Off by default; never applied on the last leg, where a slow answer beats none.
    min_throughput: MinThroughput | None = None

    @property
    def legs(self) -> list[Leg]:
        primary = Leg(upstream=self.upstream, model=self.model, continuation=self.continuation)
        return [primary, *self.fallbacks]

    def matches(self, model: str) -> bool:
        return fnmatch.fnmatchcase(model, self.match)


class Auth(_Model):
    # Empty: the client's Authorization header is passed to upstreams that have no
    # api_key of their own. Non-empty: clients must present one of these keys,
    # and it is never forwarded.
    keys: list[SecretStr] = Field(default_factory=list)


class Limits(_Model):
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # A request head (request line and headers) beyond either gets 431.
    max_header_bytes: int = Field(default=64 * 1024, gt=0)
    max_headers: int = Field(default=100, gt=0)
    # How far (bytes) a client may fall behind its stream before the run stops reading
    # the upstream until it catches up (back-pressure); one that reads nothing for
    # state.detach_grace is no longer waited for, as if it had left.
    max_client_lag_bytes: int = Field(default=1024 * 1024, gt=0)
    # httpx2's default pool of 100 connections would cap concurrent streams at 100.
    max_connections: int = Field(default=4096, gt=0)
    max_keepalive_connections: int = Field(default=512, ge=0)
    # One upstream SSE line or event; beyond it the stream counts as broken (and is
    # recovered) rather than buffered: far above any real event, far below the RAM.
    max_event_bytes: int = Field(default=8 * 1024 * 1024, gt=0)


class WebSocket(_Model):
    """The Responses API over a WebSocket (``GET /v1/responses`` upgraded: Codex CLI's
    transport, ``client.responses.connect()``). Off: every upgrade is answered 426, so
    clients fall back to HTTP in one round trip."""

    enabled: bool = True
    # Open sockets per gateway process; one more is answered 426 (the client uses HTTP).
    max_connections: int = Field(default=256, gt=0)
    # One client message (a response.create); larger closes the socket (1009).
    max_message_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # What a socket keeps for previous_response_id: its last response's input and
    # output. Larger is not kept (a later previous_response_id gets
    # previous_response_not_found, and the client sends the whole input).
    max_context_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # Seconds a socket may stay silent between responses before it is closed (1001).
    idle_timeout: float = Field(default=1800.0, gt=0)
    # Seconds a socket may live (OpenAI's: 60 minutes): the next response.create after
    # it gets websocket_connection_limit_reached and the socket closes; a response in
    # progress is never cut.
    max_lifetime: float = Field(default=3600.0, gt=0)


REDIS_SCHEMES = (
    "redis://",
    "rediss://",
    "redis+sentinel://",
    "redis+cluster://",
    "rediss+cluster://",
)


class State(_Model):
    """Durable runs (ARCHITECTURE.md section 5): where checkpoints go and how long runs live."""

    # Shared by all replicas: redis:// or rediss:// (standalone), redis+cluster://
    # (Cluster), redis+sentinel://host:26379,host2:26379/service[/db] (Sentinel).
    redis_url: SecretStr | None = None
    # auto: redis when redis_url is set, else in memory; off: no checkpoints at all.
    store: Literal["auto", "memory", "redis", "off"] = "auto"
    pool_size: int = Field(default=64, gt=0)  # Redis connections per process
    checkpoint_every: int = Field(default=4, ge=1)  # content deltas between checkpoints
    # With Redis: sync releases each event to its clients only once the checkpoint
    # holding it is acknowledged (group commit: no client is ever ahead of the store, so
    # a crash resume is exact whatever the next leg says); async releases events at once
    # and checkpoints every checkpoint_every deltas (a crash window of a few events).
    durability: Literal["sync", "async"] = "sync"
    # durability sync: replicas of the Redis primary that must acknowledge a checkpoint
    # (Redis WAIT) before its events go out, so a failover cannot lose what a client
    # has. auto: 1 where the primary has a replica, 0 where it has none.
    wait_replicas: Literal["auto"] | Annotated[int, Field(ge=0)] = "auto"
    # How long a checkpoint waits for them; then its events go out anyway, counted
    # (gateway_checkpoint_writes_total{result="unreplicated"}).
    wait_timeout: float = Field(default=2.0, gt=0)
    # A store that fails (down, or failing over) holds events back this long, so that a
    # failover finishes with nothing lost; then they go out unprotected, counted.
    unprotected_after: float = Field(default=5.0, ge=0)
    ttl: float = Field(default=3600.0, gt=0)  # seconds a run's checkpoint lives
    completed_ttl: float = Field(default=60.0, ge=0)  # kept for late resumers; 0 deletes
    detach_grace: float = Field(default=30.0, ge=0)  # a run without a client goes on this long
    # The most one run's client events may take (bytes, held in memory while it runs).
    # Past it the answer ends with the protocol's explicit error (code run_too_large)
    # and the upstream is closed. 64 MiB: a long answer is about 1 MB of SSE, the longest
    # any model writes (128k output tokens, a ~250-byte chat chunk each) about 32 MB.
    max_run_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    # All runs no client reads (detached, or whose client stopped reading) held in this
    # process's memory (bytes). Past it, finished runs kept for late resumers go first,
    # then the detached run that does not fit is stopped as when its detach_grace ends.
    # 256 MiB: four runs at max_run_bytes, or hundreds of ordinary answers.
    detached_memory: int = Field(default=256 * 1024 * 1024, gt=0)
    lease_ttl: float = Field(default=5.0, gt=0)  # an owner silent this long is presumed dead
    # A client stream with nothing to send for this long (a recovery's backoff, a long
    # Retry-After) gets a ": keepalive" comment (a Messages stream: event: ping), so
    # proxies do not time it out; never on a stream with event ids (a comment after
    # an id: line breaks SDK decoders).
    keepalive_interval: float = Field(default=15.0, gt=0)
    # Keys the hash of a run's credential; unset: shared through Redis (or per process).
    owner_key: SecretStr | None = None

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(REDIS_SCHEMES):
            raise ValueError(f"expected a URL starting with one of {', '.join(REDIS_SCHEMES)}")
        return value

    @field_validator("store", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare off as false

    @model_validator(mode="after")
    def _redis_needs_url(self) -> State:
        if self.store == "redis" and self.redis_url is None:
            raise ValueError("store: redis needs a redis_url")
        return self

    @property
    def backend(self) -> Literal["memory", "redis", "off"]:
        if self.store == "auto":
            return "redis" if self.redis_url is not None else "memory"
        return self.store


class GatewayConfig(_Model):
    listen: Listen = Listen()
    upstreams: list[Upstream] = Field(min_length=1)
    routes: list[Route] = Field(default_factory=list)
    auth: Auth = Auth()
    limits: Limits = Limits()
    websocket: WebSocket = WebSocket()
    state: State = State()
    logging: Logging = Logging()
    tracing: Tracing = Tracing()

    @model_validator(mode="after")
    def _check_references(self) -> GatewayConfig:
        names = [u.name for u in self.upstreams]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"upstream names must be unique; repeated: {', '.join(duplicates)}")
        for i, route in enumerate(self.routes):
            for leg in route.legs:
                if leg.upstream not in names:
                    raise ValueError(
                        f"routes.{i} ({route.match!r}) names upstream {leg.upstream!r}, "
                        f"which is not defined (defined: {', '.join(names)})"
                    )
        return self

    @property
    def effective_routes(self) -> list[Route]:
        """The configured routes, or one catch-all route to the first upstream."""
        return self.routes or [Route(match="*", upstream=self.upstreams[0].name)]

    def upstream(self, name: str) -> Upstream:
        return next(u for u in self.upstreams if u.name == name)


def mask(secret: SecretStr | None) -> str:
    if secret is None:
        return "(none)"
    value = secret.get_secret_value()
    return "****" + value[-4:] if len(value) >= 16 else "****"


def mask_url(secret: SecretStr) -> str:
    """A URL with its credentials masked: ``redis://:****@host:6379/0``,
    ``http://user:****@proxy:3128``, ``http://****@proxy:3128`` (a token alone).

    Everything up to the last ``@`` is userinfo, whatever a parser would make of it (a
    password with an unencoded ``/`` or ``#`` must not leak); only a user name before a
    ``:`` is kept."""
    url = secret.get_secret_value()
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    userinfo, _, host = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:****" if colon else "****"
    return f"{scheme}://{shown}@{host}"

"""How each kind of upstream is asked: its URL, its body, its credentials, its framing.

The same models are served by several providers, each with its own door:

- ``openai``, ``anthropic``: the protocol's path under ``base_url``, the body as the
  protocol built it, the key in a header, SSE back.
- ``azure`` (Azure OpenAI, chat and Responses): OpenAI's wire with the key in
  ``api-key``. The v1 form (``base_url`` up to ``/openai/v1``) is OpenAI's paths, the
  deployment in the body's ``model``; the deployments form (``api_version`` set) puts
  the leg's model, the deployment, in the path: ``/openai/deployments/{model}/chat/
  completions?api-version=...`` (Responses: ``/openai/responses?api-version=...``).
- ``bedrock`` (Claude on Amazon Bedrock, Messages): ``InvokeModelWithResponseStream``
  at ``/model/{model}/invoke-with-response-stream``; the Messages body without
  ``model`` and ``stream``, with ``anthropic_version: bedrock-2023-05-31`` and the
  client's ``anthropic-beta`` as ``anthropic_beta``; signed with SigV4, credentials
  from the AWS chain (environment, shared config and profile, container or instance
  role) by botocore, or the upstream's ``aws_profile`` or keys. The answer is AWS
  event stream framing (``application/vnd.amazon.eventstream``), decoded by botocore:
  each ``chunk`` carries one Messages event, base64 in its ``bytes``; an exception
  frame (throttling, a model stream error, service unavailable) becomes the Anthropic
  ``error`` event it means, so recovery reads it as it reads Anthropic's.
- ``vertex`` (Claude on Google Vertex AI, Messages): ``streamRawPredict`` at
  ``/projects/{project}/locations/{region}/publishers/anthropic/models/{model}``;
  the body without ``model``, with ``anthropic_version: vertex-2023-10-16``; an
  OAuth bearer token from Google's application default credentials (google-auth),
  refreshed before it expires (google-auth's ``valid``: 3 min 45 s early). SSE back.

A Bedrock or Vertex leg never gets the client's credentials (its own are the cloud's)
nor ``anthropic-version`` (in the body). Their errors before a stream are rewritten
in Anthropic's shape, so a Messages client reads them as it reads Anthropic's.
botocore and google-auth are imported only where such an upstream is configured.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import httpx
import orjson

from gateway.config import ConfigError, Upstream
from gateway.errors import ANTHROPIC_TYPES, UpstreamFailure
from gateway.upstream.sse import SSEDecoder

BEDROCK_VERSION = "bedrock-2023-05-31"
VERTEX_VERSION = "vertex-2023-10-16"
EVENTSTREAM = "application/vnd.amazon.eventstream"
GOOGLE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# Headers a cloud provider takes in the body, or not at all.
ANTHROPIC_HEADERS = frozenset({"anthropic-version", "anthropic-beta"})

# A Bedrock exception frame as the Anthropic error it means (recovery's classify reads
# the type: overloaded and API errors are transient, an invalid request is not).
BEDROCK_ERRORS = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "internalServerException": "api_error",
    "modelStreamErrorException": "api_error",
    "modelTimeoutException": "api_error",
    "validationException": "invalid_request_error",
}


def _require(upstream: Upstream, module: str, extra: str) -> None:
    """Stop at start-up, saying what to install, where a kind's library is missing."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"upstreams.{upstream.name}: kind {upstream.kind} needs {module}: "
            f"pip install 'resumable-gateway[{extra}]'"
        ) from None


class Decoder(Protocol):
    def feed(self, chunk: bytes) -> list[bytes]: ...


class Provider:
    """``openai`` and ``anthropic``: the request as the protocol built it."""

    accept = "text/event-stream"
    own_credentials = False  # signs with its cloud's credentials, never the client's
    model_in_path = False  # the leg's model is part of the URL

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    def target(self, path: str, model: str) -> str:
        """The path (and query) under ``base_url`` for the protocol's ``path``."""
        return path

    def body(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> dict[str, Any]:
        return body

    async def authorize(self, url: httpx.URL, headers: dict[str, str], content: bytes) -> None:
        """Add what proves the request's origin (a signature, a fresh token)."""

    def decoder(self, max_event_bytes: int) -> Decoder:
        return SSEDecoder(max_event_bytes)

    def error(self, status: int, content: bytes) -> bytes:
        """An error answer as the protocol's clients read it."""
        return content


class Azure(Provider):
    @property
    def model_in_path(self) -> bool:  # type: ignore[override]
        return self.upstream.api_version is not None

    def target(self, path: str, model: str) -> str:
        version = self.upstream.api_version
        if version is None:  # the v1 form: OpenAI's paths
            return path
        path, _, query = path.partition("?")
        query = "&".join(q for q in query.split("&") if q and not q.startswith("api-version="))
        query = f"api-version={quote(version)}" + (f"&{query}" if query else "")
        if path == "/responses":
            return f"/openai/responses?{query}"
        return f"/openai/deployments/{quote(model, safe='')}{path}?{query}"


class _Claude(Provider):
    """Claude on a cloud: the Messages API in the cloud's own door."""

    own_credentials = True
    model_in_path = True
    version = ""

    def body(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> dict[str, Any]:
        body = {k: v for k, v in body.items() if k != "model"}
        body.setdefault("anthropic_version", self.version)
        beta = client_headers.get("anthropic-beta")
        if beta and "anthropic_beta" not in body:
            body["anthropic_beta"] = [b.strip() for b in beta.split(",") if b.strip()]
        return body

    def error(self, status: int, content: bytes) -> bytes:
        try:
            parsed = orjson.loads(content)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("type") == "error":
            return content  # already Anthropic's shape (a model error on Vertex)
        message = None
        if isinstance(parsed, dict):
            inner = parsed.get("error")
            found = inner.get("message") if isinstance(inner, dict) else parsed.get("message")
            message = found if isinstance(found, str) else None
        kind = ANTHROPIC_TYPES.get(status, "api_error")
        text = message or f"{self.upstream.name} answered HTTP {status}"
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": text}})


class Bedrock(_Claude):
    accept = EVENTSTREAM
    version = BEDROCK_VERSION

    def __init__(self, upstream: Upstream) -> None:
        super().__init__(upstream)
        _require(upstream, "botocore", "bedrock")
        import botocore.session

        self._session = botocore.session.Session(profile=upstream.aws_profile)
        self._credentials: Any = None
        if upstream.aws_access_key_id is not None and upstream.aws_secret_access_key is not None:
            from botocore.credentials import Credentials

            token = upstream.aws_session_token
            self._credentials = Credentials(
                upstream.aws_access_key_id.get_secret_value(),
                upstream.aws_secret_access_key.get_secret_value(),
                token.get_secret_value() if token is not None else None,
            )
        self._lock = asyncio.Lock()

    def target(self, path: str, model: str) -> str:
        return f"/model/{quote(model, safe=':')}/invoke-with-response-stream"

    def body(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> dict[str, Any]:
        body = super().body(body, client_headers)
        body.pop("stream", None)  # the endpoint says it
        return body

    async def _frozen(self) -> Any:
        """The chain's credentials now (a role's are refreshed by botocore, off the loop)."""
        async with self._lock:
            if self._credentials is None:
                self._credentials = await asyncio.to_thread(self._session.get_credentials)
            if self._credentials is None:
                raise UpstreamFailure(
                    f"Upstream {self.upstream.name!r} found no AWS credentials (environment, "
                    "shared config or profile, container or instance role)."
                )
            return await asyncio.to_thread(self._credentials.get_frozen_credentials)

    async def authorize(self, url: httpx.URL, headers: dict[str, str], content: bytes) -> None:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        frozen = await self._frozen()
        credentials = Credentials(frozen.access_key, frozen.secret_key, frozen.token)
        # Signed: what no proxy rewrites (host, content type, accept); the rest of the
        # headers go along unsigned, as SigV4 allows.
        signed = {"content-type": headers["content-type"], "accept": headers["accept"]}
        request = AWSRequest(method="POST", url=str(url), headers=signed, data=content)
        SigV4Auth(credentials, "bedrock", self.upstream.region).add_auth(request)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            value = request.headers.get(name)
            if value is not None:
                headers[name.lower()] = value

    def decoder(self, max_event_bytes: int) -> Decoder:
        return EventStreamDecoder()


class Vertex(_Claude):
    version = VERTEX_VERSION

    def __init__(self, upstream: Upstream) -> None:
        super().__init__(upstream)
        _require(upstream, "google.auth", "vertex")
        self._credentials: Any = None
        self._lock = asyncio.Lock()

    def target(self, path: str, model: str) -> str:
        upstream = self.upstream
        return (
            f"/projects/{quote(upstream.project or '', safe='')}/locations/"
            f"{quote(upstream.region or '', safe='')}/publishers/anthropic/models/"
            f"{quote(model, safe='@')}:streamRawPredict"
        )

    async def _token(self) -> str:
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests

        async with self._lock:
            try:
                if self._credentials is None:
                    found = await asyncio.to_thread(google.auth.default, scopes=GOOGLE_SCOPES)
                    self._credentials = found[0]
                if not self._credentials.valid:  # none yet, or expiring within 3m45s
                    request = google.auth.transport.requests.Request()
                    await asyncio.to_thread(self._credentials.refresh, request)
            except google.auth.exceptions.GoogleAuthError as exc:
                raise UpstreamFailure(
                    f"Upstream {self.upstream.name!r} could not get a Google access token "
                    f"(application default credentials): {type(exc).__name__}."
                ) from None
            token: str = self._credentials.token
            return token

    async def authorize(self, url: httpx.URL, headers: dict[str, str], content: bytes) -> None:
        headers["authorization"] = f"Bearer {await self._token()}"


class EventStreamDecoder:
    """AWS event stream frames to the Messages events their chunks carry (botocore's
    decoder: it checks each frame's lengths and CRCs, and bounds a frame at 16 MiB of
    payload, where ``limits.max_event_bytes`` bounds an SSE event)."""

    def __init__(self) -> None:
        from botocore.eventstream import EventStreamBuffer

        self._buffer = EventStreamBuffer()

    def feed(self, chunk: bytes) -> list[bytes]:
        from botocore.eventstream import ParserError

        self._buffer.add_data(chunk)
        out = []
        try:
            for message in self._buffer:
                payload = _payload(message.headers, message.payload)
                if payload is not None:
                    out.append(payload)
        except ParserError as exc:  # a broken frame: the stream is broken
            raise httpx.RemoteProtocolError(f"bad AWS event stream frame: {exc}") from None
        return out


def _payload(headers: Mapping[str, Any], payload: bytes) -> bytes | None:
    """One frame's Messages event (or the Anthropic error it means); None for a frame
    that carries no part of the answer."""
    kind = headers.get(":message-type")
    if kind == "event":
        if headers.get(":event-type") != "chunk":
            return None
        try:
            return base64.b64decode(orjson.loads(payload)["bytes"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return payload  # not a chunk as documented: malformed
    name = str(headers.get(":exception-type") or headers.get(":error-code") or "unknown")
    try:
        message = orjson.loads(payload).get("message")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    kind_of = BEDROCK_ERRORS.get(name, "api_error")
    text = f"{message or 'Bedrock stream error'} ({name})"
    return orjson.dumps({"type": "error", "error": {"type": kind_of, "message": text}})


PROVIDERS: dict[str, type[Provider]] = {
    "openai": Provider,
    "anthropic": Provider,
    "azure": Azure,
    "bedrock": Bedrock,
    "vertex": Vertex,
}


def provider_for(upstream: Upstream) -> Provider:
    return PROVIDERS[upstream.kind](upstream)


def check_providers(upstreams: Iterable[Upstream]) -> None:
    """Raise ``ConfigError`` for an upstream whose kind's library is not installed."""
    for upstream in upstreams:
        provider_for(upstream)

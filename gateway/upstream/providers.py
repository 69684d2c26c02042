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
  ``error`` event it means, so recovery reads it as it reads Anthropic's
  (``eventstream.py``).
- ``vertex`` (Claude on Google Vertex AI, Messages): ``streamRawPredict`` at
  ``/projects/{project}/locations/{region}/publishers/anthropic/models/{model}``;
  the body without ``model``, with ``anthropic_version: vertex-2023-10-16``; an
  OAuth bearer token from Google's application default credentials (google-auth),
  refreshed before it expires (google-auth's ``valid``: 3 min 45 s early). SSE back.

- ``gemini`` (Gemini on Google's Gemini Developer API): ``/models/{model}:
  streamGenerateContent?alt=sse`` under ``base_url`` (which holds the API version,
  ``/v1beta`` by default); the key in ``x-goog-api-key`` (the upstream's ``api_key``, or
  the client's passed through); the body without ``model`` and ``stream``. SSE back,
  where an error that ends a stream is Google's raw JSON object after the events
  (``RawJSONDecoder``).
- ``vertex`` serves Gemini too, at ``…/publishers/google/models/{model}:
  streamGenerateContent?alt=sse``, with the same token; errors in Google's shape, as
  the Developer API's.

A Bedrock or Vertex leg never gets the client's credentials (its own are the cloud's)
nor ``anthropic-version`` (in the body). Their errors before a stream are rewritten
in Anthropic's shape, so a Messages client reads them as it reads Anthropic's.
botocore and google-auth are imported only where such an upstream is configured.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote

import httpx2
import orjson

from gateway.config.schema import ConfigError, Upstream
from gateway.errors import ANTHROPIC_TYPES, UpstreamFailure
from gateway.upstream.eventstream import EventStreamDecoder
from gateway.upstream.sse import RawJSONDecoder, SSEDecoder

BEDROCK_VERSION = "bedrock-2023-05-31"
VERTEX_VERSION = "vertex-2023-10-16"
EVENTSTREAM = "application/vnd.amazon.eventstream"
GOOGLE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


def _require(upstream: Upstream, module: str, extra: str) -> None:
    """Stop at start-up, saying what to install, where a kind's library is missing."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"upstreams.{upstream.name}: kind {upstream.kind} needs {module}: "
            f"pip install 'resumable-gateway[{extra}]'"
        ) from None


NO_CREDENTIALS_RETRY = 10.0  # seconds before the AWS chain is searched again, after none


class _Shared:
    """A blocking call run in a thread, once at a time: callers that arrive while it
    runs wait for the same result, and one that gives up (is cancelled) leaves it
    running for the others instead of starting another thread."""

    def __init__(self) -> None:
        self._pending: asyncio.Future[Any] | None = None

    async def run(self, call: Callable[[], Any]) -> Any:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.ensure_future(asyncio.to_thread(call))
        return await asyncio.shield(self._pending)


def _segment(model: str, safe: str) -> str:
    """A model id as one path segment: percent-encoded, never a dot segment."""
    quoted = quote(model, safe=safe)
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


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

    async def authorize(self, url: httpx2.URL, headers: dict[str, str], content: bytes) -> None:
        """Add what proves the request's origin (a signature, a fresh token)."""

    def decoder(self, max_event_bytes: int) -> Decoder:
        return SSEDecoder(max_event_bytes)

    def error(
        self, status: int, headers: Sequence[tuple[str, str]], content: bytes, path: str
    ) -> bytes:
        """An error answer to a request for ``path`` as the protocol's clients read it."""
        return content


def gemini_target(path: str, model: str, prefix: str = "") -> str:
    """A Gemini method (``:streamGenerateContent``, the adapter's path, with the client's
    query) on ``model``: always ``alt=sse``, the gateway reads an event stream."""
    method, _, query = path.partition("?")
    kept = [q for q in query.split("&") if q and not q.startswith("alt=")]
    return f"{prefix}/models/{_segment(model, '@')}{method}?" + "&".join(["alt=sse", *kept])


def is_gemini(path: str) -> bool:
    """Whether ``path`` is a Gemini method (GeminiAdapter.path): a model's ``:method``."""
    return path.startswith(":")


class GeminiAPI(Provider):
    """Gemini on Google's Gemini Developer API (generativelanguage.googleapis.com)."""

    model_in_path = True

    def target(self, path: str, model: str) -> str:
        return gemini_target(path, model)

    def body(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in ("model", "stream")}

    def decoder(self, max_event_bytes: int) -> Decoder:
        return RawJSONDecoder(max_event_bytes)


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
        if path == "/responses" or path.startswith("/responses/"):  # a response's own too
            return f"/openai{path}?{query}"
        return f"/openai/deployments/{quote(model, safe='')}{path}?{query}"


class _Claude(Provider):
    """Claude on a cloud: the Messages API in the cloud's own door."""

    own_credentials = True
    model_in_path = True
    version = ""

    def body(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> dict[str, Any]:
        body = {k: v for k, v in body.items() if k != "model"}
        body.setdefault("anthropic_version", self.version)
        return body

    def error(
        self, status: int, headers: Sequence[tuple[str, str]], content: bytes, path: str
    ) -> bytes:
        if is_gemini(path):
            return content  # Google's own shape, which Gemini clients read
        kind = ANTHROPIC_TYPES.get(status, "api_error")
        if status in (401, 403):
            # AWS's signature refusals quote the canonical request, signed session token
            # included; a cloud's refusal of credentials is said in the gateway's words.
            named = next((v for k, v in headers if k.lower() == "x-amzn-errortype"), "")
            reason = named.partition(":")[0] or f"HTTP {status}"
            text = (
                f"Upstream {self.upstream.name!r} refused the gateway's credentials "
                f"({reason}): check the credentials it uses for this cloud."
            )
            return orjson.dumps({"type": "error", "error": {"type": kind, "message": text}})
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
        self._lookup = _Shared()  # one credential lookup or refresh at a time
        self._none_until = 0.0  # no credentials found: not looked for again until then

    def target(self, path: str, model: str) -> str:
        return f"/model/{_segment(model, ':')}/invoke-with-response-stream"

    def body(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> dict[str, Any]:
        body = super().body(body, client_headers)
        body.pop("stream", None)  # the endpoint says it
        beta = client_headers.get("anthropic-beta")  # Bedrock takes betas in the body
        if beta and "anthropic_beta" not in body:
            betas = [b.strip() for b in beta.split(",") if b.strip()]
            allowed = self.upstream.anthropic_betas
            if allowed is not None:  # the ones this cloud takes (it refuses the others)
                betas = [b for b in betas if b in allowed]
            if betas:
                body["anthropic_beta"] = betas
        return body

    async def _frozen(self) -> Any:
        """The chain's credentials now: looked up once, a role's refreshed by botocore
        when due; each off the event loop, one at a time, shared by the requests that
        wait for it (a waiter that gives up does not start another)."""
        import botocore.exceptions

        loop = asyncio.get_running_loop()
        try:
            if self._credentials is None:
                if loop.time() < self._none_until:
                    raise self._none()
                found = await self._lookup.run(self._session.get_credentials)
                if found is None:
                    self._none_until = loop.time() + NO_CREDENTIALS_RETRY
                    raise self._none()
                self._credentials = found
            credentials = self._credentials
            refresh_needed = getattr(credentials, "refresh_needed", None)
            if refresh_needed is not None and refresh_needed():
                return await self._lookup.run(credentials.get_frozen_credentials)
            return credentials.get_frozen_credentials()  # no refresh due: no I/O
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            # A missing profile, partial keys, a failed SSO, credential_process or
            # assume-role: named by its kind, never by what it carried.
            raise UpstreamFailure(
                f"Upstream {self.upstream.name!r} could not get AWS credentials: "
                f"{type(exc).__name__}."
            ) from None

    def _none(self) -> UpstreamFailure:
        return UpstreamFailure(
            f"Upstream {self.upstream.name!r} found no AWS credentials (environment, "
            "shared config or profile, container or instance role)."
        )

    async def authorize(self, url: httpx2.URL, headers: dict[str, str], content: bytes) -> None:
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
        return EventStreamDecoder(max_event_bytes)


class Vertex(_Claude):
    version = VERTEX_VERSION

    def __init__(self, upstream: Upstream) -> None:
        super().__init__(upstream)
        _require(upstream, "google.auth.transport.requests", "vertex")  # and requests
        self._credentials: Any = None
        self._refresh = _Shared()  # one token fetch at a time, shared by its waiters

    def target(self, path: str, model: str) -> str:
        upstream = self.upstream
        location = (
            f"/projects/{quote(upstream.project or '', safe='')}/locations/"
            f"{quote(upstream.region or '', safe='')}/publishers"
        )
        if is_gemini(path):
            return gemini_target(path, model, f"{location}/google")
        return f"{location}/anthropic/models/{_segment(model, '@')}:streamRawPredict"

    def body(self, body: dict[str, Any], client_headers: Mapping[str, str]) -> dict[str, Any]:
        if "contents" in body:  # Gemini's request: no anthropic_version
            return {k: v for k, v in body.items() if k not in ("model", "stream")}
        return super().body(body, client_headers)

    def decoder(self, max_event_bytes: int) -> Decoder:
        # Gemini's streams end with Google's raw error object when they fail; Claude's
        # never hold a line outside the event-stream grammar.
        return RawJSONDecoder(max_event_bytes)

    async def _token(self) -> str:
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests

        def fetch() -> Any:  # in a thread: google-auth's requests are blocking
            credentials = self._credentials
            if credentials is None:
                credentials, _ = google.auth.default(scopes=GOOGLE_SCOPES)
            if not credentials.valid:  # none yet, or expiring within 3m45s
                credentials.refresh(google.auth.transport.requests.Request())
            return credentials

        credentials = self._credentials
        if credentials is None or not credentials.valid:
            try:
                self._credentials = credentials = await self._refresh.run(fetch)
            except google.auth.exceptions.GoogleAuthError as exc:
                raise UpstreamFailure(
                    f"Upstream {self.upstream.name!r} could not get a Google access token "
                    f"(application default credentials): {type(exc).__name__}."
                ) from None
        token: str = credentials.token
        return token

    async def authorize(self, url: httpx2.URL, headers: dict[str, str], content: bytes) -> None:
        headers["authorization"] = f"Bearer {await self._token()}"


PROVIDERS: dict[str, type[Provider]] = {
    "openai": Provider,
    "anthropic": Provider,
    "azure": Azure,
    "bedrock": Bedrock,
    "vertex": Vertex,
    "gemini": GeminiAPI,
}


def provider_for(upstream: Upstream) -> Provider:
    return PROVIDERS[upstream.kind](upstream)


def check_providers(upstreams: Iterable[Upstream]) -> None:
    """Raise ``ConfigError`` for an upstream whose kind's library is not installed."""
    for upstream in upstreams:
        provider_for(upstream)

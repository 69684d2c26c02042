"""The chaos upstream as the clouds that serve the same models: Amazon Bedrock and Google
Vertex AI (Claude, the Messages API), Azure OpenAI (chat, Responses).

Each dialect is a door to the same answers (``messages.py``, ``render.py``) with the
cloud's own URL, credentials and, for Bedrock, framing:

- Bedrock: ``POST /model/{model}/invoke-with-response-stream`` (and ``/invoke``), the
  body without ``model``, with ``anthropic_version: bedrock-2023-05-31``; SigV4 checked
  with botocore against ``BEDROCK_CREDENTIALS``; the answer in AWS event stream frames,
  each ``chunk`` carrying one Messages event in base64, an in-band error as an
  exception frame (``throttlingException``, ``serviceUnavailableException``…); errors
  before the stream as Bedrock's ``{"message"}`` with ``x-amzn-ErrorType``.
- Vertex: ``POST /v1/projects/{p}/locations/{r}/publishers/anthropic/models/{model}:
  streamRawPredict`` (and ``:rawPredict``), ``anthropic_version: vertex-2023-10-16``,
  a bearer token this server issued at ``POST /token`` (the OAuth token endpoint of
  the credentials the tests give google-auth) or ``VERTEX_TOKEN``; SSE as Anthropic's.
- Azure: ``/openai/deployments/{deployment}/chat/completions?api-version=…``,
  ``/openai/responses?api-version=…``, and the v1 form ``/openai/v1/…``; the key in
  ``api-key`` (``AZURE_KEY``).

``AnthropicBedrock`` and ``AnthropicVertex`` (the anthropic SDK's own clients) pointed
at this server stream and parse every event: tests/chaos/test_cloud_dialects.py.
"""

from __future__ import annotations

import base64
import re
import secrets
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import orjson

from gateway.chaos.http11 import Request, response_head

# The AWS credentials the Bedrock dialect accepts: access key id -> secret.
BEDROCK_CREDENTIALS = {"AKIDCHAOSBEDROCK0001": "chaos-bedrock-secret-access-key"}
BEDROCK_VERSION = "bedrock-2023-05-31"
VERTEX_VERSION = "vertex-2023-10-16"
VERTEX_TOKEN = "ya29.chaos-vertex-token"  # always accepted (the SDK's access_token=)
AZURE_KEY = "chaos-azure-key-0001"

EVENTSTREAM_HEAD = response_head(
    200,
    [
        ("content-type", "application/vnd.amazon.eventstream"),
        ("x-amzn-bedrock-content-type", "application/json"),
        ("transfer-encoding", "chunked"),
    ],
)

# The exception a Bedrock stream sends for each Anthropic in-band error type.
BEDROCK_EXCEPTIONS = {
    "overloaded_error": "serviceUnavailableException",
    "rate_limit_error": "throttlingException",
    "api_error": "internalServerException",
    "invalid_request_error": "validationException",
}
# The exception name of an error status (x-amzn-ErrorType), Bedrock's way.
BEDROCK_STATUS_ERRORS = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
    529: "ServiceUnavailableException",
}

_BEDROCK_PATH = re.compile(r"^/model/([^/]+)/(invoke|invoke-with-response-stream)$")
_VERTEX_PATH = re.compile(
    r"^/v1/projects/([^/]+)/locations/([^/]+)/publishers/anthropic/models/([^/]+)"
    r":(rawPredict|streamRawPredict)$"
)
_AZURE_DEPLOYMENT = re.compile(r"^/openai/deployments/([^/]+)/(chat/completions|completions)$")


@dataclass(frozen=True)
class Door:
    """Which cloud a request came in by, and where its answer lives here."""

    dialect: str  # bedrock, vertex, azure
    path: str  # the answer's own path here: /v1/messages, /v1/chat/completions…
    model: str | None  # named by the URL (Bedrock, Vertex, an Azure deployment)
    stream: bool | None  # said by the URL (Bedrock, Vertex)


def door_of(request: Request) -> Door | None:
    """The cloud door ``request`` came by; None for the OpenAI and Anthropic paths."""
    path = request.path
    if found := _BEDROCK_PATH.match(path):
        stream = found.group(2) == "invoke-with-response-stream"
        return Door("bedrock", "/v1/messages", unquote(found.group(1)), stream)
    if found := _VERTEX_PATH.match(path):
        stream = found.group(4) == "streamRawPredict"
        return Door("vertex", "/v1/messages", unquote(found.group(3)), stream)
    if found := _AZURE_DEPLOYMENT.match(path):
        return Door("azure", "/v1/" + found.group(2), unquote(found.group(1)), None)
    if path in ("/openai/responses", "/openai/v1/responses"):
        return Door("azure", "/v1/responses", None, None)
    if path in ("/openai/v1/chat/completions", "/openai/v1/completions"):
        return Door("azure", path.replace("/openai", "", 1), None, None)
    return None


# -- credentials -----------------------------------------------------------------------


class Refused(Exception):
    """A request the cloud would refuse: its status, body and headers."""

    def __init__(self, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()):
        super().__init__(body.decode(errors="replace"))
        self.status = status
        self.body = body
        self.headers = list(headers)


def bedrock_error(status: int, message: str, kind: str | None = None) -> Refused:
    kind = kind or BEDROCK_STATUS_ERRORS.get(status, "InternalServerException")
    body = orjson.dumps({"message": message})
    return Refused(status, body, [("x-amzn-errortype", f"{kind}:http://internal.amazon.com/")])


def check_sigv4(request: Request, region_service: str = "bedrock") -> None:
    """Check a request's SigV4 signature as AWS would: recomputed with botocore from the
    headers it names as signed, the access key's secret and its own timestamp."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    authorization = request.headers.get("authorization", "")
    found = re.fullmatch(
        r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
        r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})",
        authorization,
    )
    if found is None:
        raise bedrock_error(403, "Missing Authentication Token")
    key_id, _, region, service, signed, signature = found.groups()
    secret = BEDROCK_CREDENTIALS.get(key_id)
    if secret is None or service != region_service:
        message = "The security token included in the request is invalid."
        raise bedrock_error(403, message, "UnrecognizedClientException")
    names = signed.split(";")
    headers = {name: request.headers.get(name, "") for name in names}
    host = request.headers.get("host", "")
    url = f"http://{host}{request.path}" + (f"?{request.query}" if request.query else "")
    aws = AWSRequest(method=request.method, url=url, headers=headers, data=request.body)
    aws.context["timestamp"] = request.headers.get("x-amz-date", "")
    token = request.headers.get("x-amz-security-token")
    signer = SigV4Auth(Credentials(key_id, secret, token), service, region)
    canonical = signer.canonical_request(aws)
    expected = signer.signature(signer.string_to_sign(aws, canonical), aws)
    if not secrets.compare_digest(expected, signature):
        raise bedrock_error(
            403,
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
            "InvalidSignatureException",
        )


class Tokens:
    """The Vertex dialect's OAuth token endpoint: tokens it issued, and how long they live."""

    def __init__(self) -> None:
        self.issued: set[str] = {VERTEX_TOKEN}
        self.requests = 0  # token requests answered (a refresh is one)
        self.lifetime = 3600  # expires_in of the next tokens

    def issue(self) -> bytes:
        self.requests += 1
        token = f"ya29.chaos-{secrets.token_hex(8)}"
        self.issued.add(token)
        return orjson.dumps(
            {"access_token": token, "expires_in": self.lifetime, "token_type": "Bearer"}
        )

    def check(self, request: Request) -> None:
        authorization = request.headers.get("authorization", "")
        token = authorization.removeprefix("Bearer ")
        if authorization.startswith("Bearer ") and token in self.issued:
            return
        body = orjson.dumps(
            {
                "error": {
                    "code": 401,
                    "message": "Request had invalid authentication credentials. Expected "
                    "OAuth 2 access token, login cookie or other valid authentication "
                    "credential.",
                    "status": "UNAUTHENTICATED",
                }
            }
        )
        raise Refused(401, body)


def check_azure(request: Request, door: Door) -> None:
    if request.headers.get("api-key") != AZURE_KEY:
        message = (
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure "
            "to provide a valid key for an active subscription and use a correct regional "
            "API endpoint for your resource."
        )
        raise Refused(401, orjson.dumps({"error": {"code": "401", "message": message}}))
    legacy = not request.path.startswith("/openai/v1/")
    if legacy and "api-version=" not in request.query:
        body = {"error": {"code": "404", "message": "Resource not found"}}
        raise Refused(404, orjson.dumps(body))


def check_claude_body(door: Door, payload: dict[str, object]) -> None:
    """The body a cloud takes: its own anthropic_version, no model (it is in the URL)."""
    version = BEDROCK_VERSION if door.dialect == "bedrock" else VERTEX_VERSION
    problem = None
    said = payload.get("anthropic_version")
    # The cloud's documented value, or a dated API version (what the anthropic SDK's
    # own cloud clients send from 2026 on).
    if said != version and not (isinstance(said, str) and re.fullmatch(r"\d{4}-\d\d-\d\d", said)):
        problem = f"anthropic_version: expected {version!r}"
    elif "model" in payload:
        problem = "model: Extra inputs are not permitted"
    elif door.dialect == "bedrock" and "stream" in payload:
        problem = "stream: Extra inputs are not permitted"
    if problem is None:
        return
    if door.dialect == "bedrock":
        raise bedrock_error(400, f"Malformed input request: {problem}")
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": problem}}
    raise Refused(400, orjson.dumps(body))


# -- Bedrock's framing -----------------------------------------------------------------


def frame(headers: Sequence[tuple[str, str]], payload: bytes) -> bytes:
    """One AWS event stream message: prelude (total and headers length, CRC), string
    headers, payload, message CRC (botocore has a decoder only)."""
    encoded = b"".join(
        len(name).to_bytes(1, "big")
        + name.encode()
        + b"\x07"  # type 7: string
        + len(value.encode()).to_bytes(2, "big")
        + value.encode()
        for name, value in headers
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = total.to_bytes(4, "big") + len(encoded).to_bytes(4, "big")
    message = prelude + zlib.crc32(prelude).to_bytes(4, "big") + encoded + payload
    return message + zlib.crc32(message).to_bytes(4, "big")


def chunk_frame(data: bytes) -> bytes:
    """A ``chunk`` event carrying one Messages event's JSON (base64, as Bedrock sends)."""
    payload = orjson.dumps({"bytes": base64.b64encode(data).decode()})
    headers = [
        (":event-type", "chunk"),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ]
    return frame(headers, payload)


def exception_frame(error_type: str, message: str) -> bytes:
    headers = [
        (":exception-type", BEDROCK_EXCEPTIONS.get(error_type, "internalServerException")),
        (":content-type", "application/json"),
        (":message-type", "exception"),
    ]
    return frame(headers, orjson.dumps({"message": message}))


def bedrock_frames(events: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """A Messages stream's events as Bedrock frames: an ``error`` event becomes an
    exception frame, every other event a chunk."""
    frames = []
    for kind, data in events:
        if kind == b"error":
            try:
                error = orjson.loads(data)["error"]
                frames.append(exception_frame(error["type"], error["message"]))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                frames.append(exception_frame("api_error", "Internal server error"))
        else:
            frames.append(chunk_frame(data))
    return frames

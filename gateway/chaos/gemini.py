"""The Gemini dialect of the chaos upstream: its doors, what it reads in a request, what it
refuses, and its errors (the stream itself is ``gemini_stream.py``).

Two doors to the same answers (``answer.py``), told apart as ``door`` everywhere:

- ``gemini``, the Developer API: ``POST /{v1,v1beta,v1alpha}/models/{model}:{method}``,
  ``method`` one of ``streamGenerateContent`` (``?alt=sse``), ``generateContent``,
  ``countTokens``; ``GET /{version}/models`` lists ``models/gemini-2.5-flash``. The key
  in ``x-goog-api-key`` or ``?key=``: any key but ``INVALID_KEY``; none is a 403
  PERMISSION_DENIED, ``INVALID_KEY`` a 400 API_KEY_INVALID, as Google answers.
- ``vertex``, Vertex AI: ``POST /{v1,v1beta1}/projects/{p}/locations/{r}/publishers/
  google/models/{model}:{method}``, with a bearer token the Claude-on-Vertex door would
  take (``clouds.Tokens``), and a ``role`` on every content.

The model segment is percent-decoded, its method split off at the last ``:``; it is
the chaos spec (``chaos:text=40,fault=reset,at=3``) unless an ``x-chaos`` header
gives one. A chaos spec answers as ``modelVersion`` ``gemini-2.5-flash``; a real name
(with ``x-chaos``) as itself.

Continuation: a trailing ``model`` turn is a prefill, answered from where its text
parts end; refused as Gemini 3 refuses it (``PREFILL_REFUSED``, a 400) by a model named
``gemini-3…`` (the spec in ``x-chaos``) or a spec with ``prefill=0``. Prompt mode (a
``model`` turn, then a ``user`` turn asking to continue, with or without an anchor) is
read as chat's, from ``chat_view``. A conversation that ends with ``functionResponse``
parts is a new turn, answered in text.

Thought signatures (``thought_signature``) are base64 of a nonce and an HMAC, with a
secret per door, over the part they ride on (a ``functionCall``'s name and args, or a
text part's text): new per response, verifiable without state, never valid on the other
door. Every request, whatever the model, is checked as Gemini 3 checks it
(``refused_signatures``): a signature anywhere must be valid for its part here
("Corrupted thought signature."), and in the current turn (after the last ``user``
content that is not tool results) the first ``functionCall`` of each ``model`` step
(consecutive ``model`` contents, one response) must carry one (``MISSING``); the calls
after it in a step carry none, as Gemini sends parallel calls. ``SKIP_SIGNATURE``
(Google's documented dummy) passes both checks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson

from gateway.chaos.http11 import Request

DEVELOPER = "gemini"
VERTEX = "vertex"
DOORS = (DEVELOPER, VERTEX)
GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT = "countTokens"
LIST = "models"  # GET /{version}/models, or /{version}/models/{model} (Door.model)

MODEL_VERSION = "gemini-2.5-flash"  # what a chaos spec answers as
INVALID_KEY = "chaos-invalid-gemini-key"  # the one key the Developer door refuses
SKIP_SIGNATURE = "skip_thought_signature_validator"
# Each door signs with its own secret: a signature is never valid on the other.
_SECRETS = {DEVELOPER: b"chaos-gemini-developer-secret", VERTEX: b"chaos-gemini-vertex-secret"}
_NONCE = 12
_MAC = 20

PREFILL_REFUSED = "Requests ending with a model turn are not supported for this model."
CORRUPTED = "Corrupted thought signature."
MISSING = (
    "Function call is missing a thought_signature in functionCall parts. This is required "
    "for tools to work correctly, and missing thought_signature may lead to degraded model "
    "performance. Additional data, function call `default_api:{name}` , position {position}. "
    "Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
)

_METHODS = f"({STREAM}|{GENERATE}|{COUNT})"
_DEVELOPER_PATH = re.compile(rf"^/(v1|v1beta|v1alpha)/models/(.+):{_METHODS}$")
_VERTEX_PATH = re.compile(
    rf"^/(v1|v1beta1)/projects/([^/]+)/locations/([^/]+)/publishers/google/models/(.+)"
    rf":{_METHODS}$"
)
_LIST_PATH = re.compile(r"^/(v1|v1beta|v1alpha)/models(?:/([^/:]+))?$")

_MODELS = [
    {
        "name": f"models/{name}",
        "version": "001",
        "displayName": name,
        "inputTokenLimit": 1048576,
        "outputTokenLimit": 65536,
        "supportedGenerationMethods": [GENERATE, COUNT, STREAM],
        "thinking": True,
    }
    for name in (MODEL_VERSION, "gemini-2.5-pro", "gemini-3-pro-preview")
]
MODELS = orjson.dumps({"models": _MODELS})


@dataclass(frozen=True)
class Door:
    """A Gemini request: which door, which method, the model segment (decoded), the
    API version of its URL."""

    door: str  # DEVELOPER or VERTEX
    method: str  # STREAM, GENERATE, COUNT or LIST
    model: str
    version: str


def door_of(request: Request) -> Door | None:
    """The Gemini door ``request`` came by, or None. ``GET /v1/models[/{model}]`` is
    Gemini's only with a Gemini key (else OpenAI's)."""
    path = request.path
    if request.method == "POST":
        if found := _DEVELOPER_PATH.match(path):
            version, model, method = found.groups()
            return Door(DEVELOPER, method, unquote(model).removeprefix("models/"), version)
        if found := _VERTEX_PATH.match(path):
            version, _, _, model, method = found.groups()
            return Door(VERTEX, method, unquote(model), version)
    elif request.method == "GET" and (found := _LIST_PATH.match(path)):
        version, model = found.groups()
        if version != "v1" or api_key(request) is not None:
            return Door(DEVELOPER, LIST, unquote(model or ""), version)
    return None


def model_version(door: Door) -> str:
    """The ``modelVersion`` an answer says: the URL's model, unless that is a chaos spec."""
    return MODEL_VERSION if door.model.startswith("chaos") else door.model


def models(door: Door) -> bytes:
    """``GET …/models`` (the list), or ``GET …/models/{model}``: one, or ``Refused`` 404."""
    if not door.model:
        return MODELS
    for model in _MODELS:
        if model["name"] == f"models/{door.model}":
            return orjson.dumps(model)
    message = f"models/{door.model} is not found for API version {door.version}"
    raise Refused(404, "NOT_FOUND", message)


def api_key(request: Request) -> str | None:
    """The Developer API key: ``x-goog-api-key``, else ``?key=``."""
    key = request.headers.get("x-goog-api-key")
    if key:
        return key
    keys = parse_qs(request.query).get("key")
    return keys[0] if keys else None


# -- errors --------------------------------------------------------------------------------


def error_body(code: int, status: str, message: str, details: list[Any] | None = None) -> bytes:
    """Google's error document, pretty-printed over several lines as its servers send it."""
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return orjson.dumps({"error": error}, option=orjson.OPT_INDENT_2) + b"\n"


def compact_error(code: int, status: str, message: str) -> bytes:
    """The same error on one line, as a ``data:`` event carries it."""
    return orjson.dumps({"error": {"code": code, "message": message, "status": status}})


class Refused(Exception):
    """A request Gemini would refuse: its status and body."""

    def __init__(self, code: int, status: str, message: str, details: list[Any] | None = None):
        super().__init__(message)
        self.code = code
        self.body = error_body(code, status, message, details)


OVERLOADED = (503, "UNAVAILABLE", "The model is overloaded. Please try again later.")
INTERNAL = (
    500,
    "INTERNAL",
    "An internal error has occurred. Please retry or report in "
    "https://developers.generativeai.google/guide/troubleshooting",
)
INVALID = (400, "INVALID_ARGUMENT", "Request contains an invalid argument.")

# http_* faults: (code, status, message) of the error status Google answers.
HTTP_ERRORS: dict[str, tuple[int, str, str]] = {
    "http_400": INVALID,
    "http_400_context": (
        400,
        "INVALID_ARGUMENT",
        "The input token count (9000) exceeds the maximum number of tokens allowed (8192).",
    ),
    "http_401": (
        401,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential.",
    ),
    "http_404": (
        404,
        "NOT_FOUND",
        "models/chaos is not found for API version v1beta, or is not supported for "
        "generateContent. Call ListModels to see the list of available models and their "
        "supported methods.",
    ),
    "http_429": (429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    "http_429_retry": (
        429,
        "RESOURCE_EXHAUSTED",
        "Resource has been exhausted (e.g. check quota).",
    ),
    "http_500": INTERNAL,
    "http_502": (502, "UNAVAILABLE", "Bad gateway (chaos)."),
    "http_503": OVERLOADED,
    "http_529": (529, "UNAVAILABLE", "Overloaded (chaos)."),
}

# In-band faults: (code, status, message), and whether it comes as a raw JSON object
# after the events (what Google's servers send) or as a ``data:`` event.
IN_BAND_ERRORS: dict[str, tuple[tuple[int, str, str], bool]] = {
    "error": (OVERLOADED, True),
    "error_fatal": (INVALID, True),
    "finish_error": (INTERNAL, True),
    "error_data": (OVERLOADED, False),
    "error_done": (OVERLOADED, False),
}


def http_error(fault: str, retry_after: int) -> tuple[int, bytes]:
    """The status and body of an ``http_*`` fault; ``http_429_retry``'s says its delay."""
    code, status, message = HTTP_ERRORS[fault]
    details = None
    if fault == "http_429_retry":
        retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo"}
        details = [retry | {"retryDelay": f"{retry_after}s"}]
    return code, error_body(code, status, message, details)


def check_auth(request: Request, door: Door) -> None:
    """The Developer door's key (the Vertex door's token is ``clouds.Tokens.check``)."""
    key = api_key(request)
    if key is None:
        raise Refused(
            403,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established "
            "identity). Please use API Key or other form of API consumer identity to call "
            "this API.",
        )
    if key == INVALID_KEY:
        reason = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "API_KEY_INVALID",
            "domain": "googleapis.com",
        }
        message = "API key not valid. Please pass a valid API key."
        raise Refused(400, "INVALID_ARGUMENT", message, [reason])


# -- reading a request ---------------------------------------------------------------------


def _get(obj: Any, camel: str, snake: str) -> Any:
    """A field by its JSON name or its proto (snake_case) name, as Google accepts both."""
    if not isinstance(obj, dict):
        return None
    return obj[camel] if camel in obj else obj.get(snake)


def contents_of(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``contents`` (a bare string or content is read as one user turn)."""
    contents = payload.get("contents")
    if isinstance(contents, dict):
        contents = [contents]
    if isinstance(contents, str):
        contents = [{"role": "user", "parts": [{"text": contents}]}]
    if not isinstance(contents, list):
        return []
    return [content for content in contents if isinstance(content, dict)]


def parts_of(content: Any) -> list[dict[str, Any]]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [part for part in parts if isinstance(part, dict)] if isinstance(parts, list) else []


def check_body(door: Door, payload: Any) -> list[dict[str, Any]]:
    """The contents of a generate request, or ``Refused`` as Google refuses its shape."""
    if not isinstance(payload, dict):
        raise Refused(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
    contents = contents_of(payload)
    if not contents:
        message = "* GenerateContentRequest.contents: contents is not specified\n"
        raise Refused(400, "INVALID_ARGUMENT", message)
    if door.door == VERTEX and any(c.get("role") not in ("user", "model") for c in contents):
        raise Refused(400, "INVALID_ARGUMENT", "Please use a valid role: user, model.")
    return contents


def asks_thoughts(payload: dict[str, Any]) -> bool:
    """Whether ``generationConfig.thinkingConfig.includeThoughts`` (either spelling) is set."""
    config = _get(payload, "generationConfig", "generation_config")
    thinking = _get(config, "thinkingConfig", "thinking_config")
    return _get(thinking, "includeThoughts", "include_thoughts") is True


def _is_tool_results(content: dict[str, Any]) -> bool:
    parts = parts_of(content)
    return bool(parts) and all(
        _get(part, "functionResponse", "function_response") is not None for part in parts
    )


def _text(content: dict[str, Any]) -> str:
    """The answer text of a content: its text parts, thoughts left out."""
    texts = (part.get("text") for part in parts_of(content) if part.get("thought") is not True)
    return "".join(text for text in texts if isinstance(text, str))


def chat_view(contents: list[dict[str, Any]]) -> dict[str, Any]:
    """The conversation as chat messages (``model`` as ``assistant``, a turn of tool results
    as ``tool``, consecutive ``model`` contents as one message), so the continuation rules
    of the other dialects read it: a trailing model turn is a prefill
    (``messages.messages_prefix``), else prompt mode (``asked.assistant_prefix``,
    ``asked.anchor_of``); tool results end the turn (``asked.ends_in_tool_results``)."""
    messages: list[dict[str, Any]] = []
    for content in contents:
        role = content.get("role") or "user"
        if role == "model":
            if messages and messages[-1]["role"] == "assistant":
                messages[-1]["content"] += _text(content)
                continue
            messages.append({"role": "assistant", "content": _text(content)})
        elif _is_tool_results(content):
            messages.append({"role": "tool", "content": ""})
        else:
            messages.append({"role": "user", "content": _text(content)})
    return {"messages": messages}


def refuses_prefill(door: Door, spec_prefill: bool) -> bool:
    """Whether this model refuses a trailing ``model`` turn: Gemini 3 (a model named
    ``gemini-3…``), or a spec with ``prefill=0``."""
    return not spec_prefill or door.model.startswith("gemini-3")


def ends_in_model_turn(contents: list[dict[str, Any]]) -> bool:
    return bool(contents) and contents[-1].get("role") == "model"


# -- thought signatures --------------------------------------------------------------------


def signed_content(part: dict[str, Any]) -> bytes:
    """What a signature on ``part`` covers: a call's name and args, or a part's text."""
    call = _get(part, "functionCall", "function_call")
    if isinstance(call, dict):
        named = {"name": call.get("name"), "args": call.get("args") or {}}
        return b"functionCall\0" + orjson.dumps(named, option=orjson.OPT_SORT_KEYS)
    text = part.get("text")
    if isinstance(text, str):
        return (b"thought\0" if part.get("thought") is True else b"text\0") + text.encode()
    rest = {k: v for k, v in part.items() if k not in ("thoughtSignature", "thought_signature")}
    return b"part\0" + orjson.dumps(rest, option=orjson.OPT_SORT_KEYS)


def _mac(door: str, nonce: bytes, content: bytes) -> bytes:
    return hmac.new(_SECRETS[door], nonce + content, hashlib.sha256).digest()[:_MAC]


def thought_signature(door: str, part: dict[str, Any], nonce: bytes | None = None) -> str:
    """A signature ``door`` issues for ``part`` (standard base64; a fresh nonce if None)."""
    nonce = secrets.token_bytes(_NONCE) if nonce is None else nonce
    return base64.b64encode(nonce + _mac(door, nonce, signed_content(part))).decode()


def _decoded(signature: str) -> bytes | None:
    """The bytes of a signature in standard or URL-safe base64 (the Python SDK sends the
    latter), padded or not."""
    normal = signature.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(normal + "=" * (-len(normal) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def signature_of(part: dict[str, Any]) -> Any:
    return _get(part, "thoughtSignature", "thought_signature")


def signature_valid(door: str, part: dict[str, Any]) -> bool:
    """Whether ``part``'s signature is one ``door`` issued for it (or the dummy)."""
    signature = signature_of(part)
    if not isinstance(signature, str):
        return False
    raw = _decoded(signature)
    if signature == SKIP_SIGNATURE or raw == SKIP_SIGNATURE.encode():
        return True
    if raw is None or len(raw) != _NONCE + _MAC:
        return False
    nonce, mac = raw[:_NONCE], raw[_NONCE:]
    return hmac.compare_digest(mac, _mac(door, nonce, signed_content(part)))


def _current_turn(contents: list[dict[str, Any]]) -> int:
    """Where the current turn starts: after the last user content that is not tool results."""
    start = 0
    for index, content in enumerate(contents):
        if content.get("role", "user") == "user" and not _is_tool_results(content):
            start = index + 1
    return start


def _steps(contents: list[dict[str, Any]], start: int) -> Iterator[list[tuple[int, Any]]]:
    """The model steps from ``start``: each run of consecutive ``model`` contents, as
    (content index, part) pairs."""
    step: list[tuple[int, Any]] = []
    for index in range(start, len(contents)):
        if contents[index].get("role") == "model":
            step += [(index, part) for part in parts_of(contents[index])]
        elif step:
            yield step
            step = []
    if step:
        yield step


def refused_signatures(door: str, contents: list[dict[str, Any]]) -> str | None:
    """Why Gemini 3 would refuse the signatures in ``contents``, or None."""
    for content in contents:
        for part in parts_of(content):
            if signature_of(part) is not None and not signature_valid(door, part):
                return CORRUPTED
    for step in _steps(contents, _current_turn(contents)):
        calls = [
            (i, p) for i, p in step if isinstance(_get(p, "functionCall", "function_call"), dict)
        ]
        if calls and signature_of(calls[0][1]) is None:
            index, part = calls[0]
            name = _get(part, "functionCall", "function_call").get("name")
            return MISSING.format(name=name, position=index + 1)
    return None

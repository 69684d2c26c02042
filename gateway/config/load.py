"""Loading a configuration: a YAML file with ``${ENV}`` interpolation, or the embedded
defaults, validated once, at start-up. A bad file fails with a message that names the
key and says what was expected, never echoing a value that may hold a credential.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.schema import (
    DEFAULT_ANTHROPIC_URL,
    DEFAULT_GEMINI_URL,
    DEFAULT_UPSTREAM_URL,
    ENV_PREFIX,
    ConfigError,
    GatewayConfig,
)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate_env(node: Any, env: Mapping[str, str], path: str = "") -> Any:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in every string of a YAML tree."""
    if isinstance(node, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(f"{path or '<root>'}: environment variable {name} is not set")

        return _ENV_REF.sub(substitute, node)
    if isinstance(node, dict):
        return {
            k: interpolate_env(v, env, f"{path}.{k}" if path else str(k)) for k, v in node.items()
        }
    if isinstance(node, list):
        return [interpolate_env(v, env, f"{path}.{i}") for i, v in enumerate(node)]
    return node


# Keys whose values may hold credentials (a URL may carry user:password): never echoed.
_SECRET_KEYS = frozenset(
    {
        *("api_key", "base_url", "headers", "keys", "redis_url", "owner_key", "proxy"),
        *("aws_access_key_id", "aws_secret_access_key", "aws_session_token"),
    }
)


def parse_config(data: Any, source: str = "config") -> GatewayConfig:
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            key = ".".join(str(p) for p in err["loc"]) or "<root>"
            message = err["msg"]
            shown = err.get("input")
            secretive = any(part in _SECRET_KEYS for part in err["loc"])
            if err["type"] not in {"missing", "extra_forbidden"} and not secretive:
                if not isinstance(shown, dict | list):
                    message += f" (got {shown!r})"
            problems.append(f"  {key}: {message}")
        raise ConfigError(f"{source} is invalid:\n" + "\n".join(problems)) from None


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return parse_config(interpolate_env(raw, os.environ if env is None else env), str(path))


def default_config(env: Mapping[str, str] | None = None) -> GatewayConfig:
    """The embedded defaults: one upstream from the environment, in-memory state.

    ``GATEWAY_UPSTREAM_BASE_URL`` (default: OpenAI), ``GATEWAY_UPSTREAM_API_KEY``
    (unset: the client's own key is passed through), ``GATEWAY_KEYS`` (comma-separated
    gateway keys clients must present; unset: none), ``GATEWAY_REDIS_URL``. Messages
    API requests go to an anthropic upstream: ``GATEWAY_ANTHROPIC_BASE_URL`` (default:
    Anthropic's) and ``GATEWAY_ANTHROPIC_API_KEY`` (unset: the client's own x-api-key);
    Gemini API requests to a gemini upstream: ``GATEWAY_GEMINI_BASE_URL`` (default:
    Google's Gemini Developer API) and ``GATEWAY_GEMINI_API_KEY`` (unset: the client's
    own x-goog-api-key). The client-side ``OPENAI_*``, ``ANTHROPIC_*`` and ``GEMINI_*``
    variables are deliberately not read: clients set ``OPENAI_BASE_URL``
    (``ANTHROPIC_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL``) to the gateway itself.
    """
    env = os.environ if env is None else env
    upstream: dict[str, Any] = {
        "name": "default",
        "base_url": env.get(ENV_PREFIX + "UPSTREAM_BASE_URL", DEFAULT_UPSTREAM_URL),
    }
    if key := env.get(ENV_PREFIX + "UPSTREAM_API_KEY"):
        upstream["api_key"] = key
    anthropic: dict[str, Any] = {
        "name": "anthropic",
        "kind": "anthropic",
        "base_url": env.get(ENV_PREFIX + "ANTHROPIC_BASE_URL", DEFAULT_ANTHROPIC_URL),
    }
    if key := env.get(ENV_PREFIX + "ANTHROPIC_API_KEY"):
        anthropic["api_key"] = key
    gemini: dict[str, Any] = {
        "name": "gemini",
        "kind": "gemini",
        "base_url": env.get(ENV_PREFIX + "GEMINI_BASE_URL", DEFAULT_GEMINI_URL),
    }
    if key := env.get(ENV_PREFIX + "GEMINI_API_KEY"):
        gemini["api_key"] = key
    # Every model on each; a request goes to the first that serves its API, and
    # requests without a model (the last route's: /v1/models, files) to the default.
    routes = [
        {"match": "*", "upstream": "anthropic"},
        {"match": "*", "upstream": "gemini"},
        {"match": "*", "upstream": "default"},
    ]
    data: dict[str, Any] = {"upstreams": [upstream, anthropic, gemini], "routes": routes}
    if keys := [k.strip() for k in env.get(ENV_PREFIX + "KEYS", "").split(",") if k.strip()]:
        data["auth"] = {"keys": keys}
    if redis_url := env.get(ENV_PREFIX + "REDIS_URL"):
        data["state"] = {"redis_url": redis_url}
    return parse_config(data, "embedded defaults")

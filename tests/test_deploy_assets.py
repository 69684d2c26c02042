"""The container assets agree with the code (no Docker engine here: checked statically)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gateway.app import create_app
from gateway.config import default_config

ROOT = Path(__file__).parent.parent


def compose() -> dict[str, dict[str, dict[str, Any]]]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_names_gateway_redis_and_a_demo_chaos_upstream() -> None:
    services = compose()["services"]
    assert set(services) == {"gateway", "redis", "chaos"}
    assert services["gateway"]["ports"] == ["8080:8080"]
    assert services["chaos"]["profiles"] == ["demo"]
    assert "gateway" not in services["redis"].get("profiles", [])


def test_compose_environment_is_what_the_embedded_defaults_read() -> None:
    env = compose()["services"]["gateway"]["environment"]
    assert isinstance(env, dict)
    resolved = {k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(v)) for k, v in env.items()}
    config = default_config(resolved)
    assert config.upstreams[0].base_url == resolved["GATEWAY_UPSTREAM_BASE_URL"]
    assert config.state.redis_url is not None
    assert config.state.redis_url.get_secret_value() == "redis://redis:6379/0"


def test_dockerfile_runs_non_root_on_the_compose_port_with_a_healthcheck() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.M)
    assert "EXPOSE 8080" in dockerfile
    assert '"--port", "8080"' in dockerfile
    assert "/healthz" in dockerfile.split("HEALTHCHECK", 1)[1]
    app = create_app(default_config({}))
    assert "/healthz" in {getattr(route, "path", None) for route in app.routes}

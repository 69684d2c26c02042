"""The tests' Redis fixtures themselves, where they can be checked without Docker."""

from __future__ import annotations

import sys
import warnings

from tests.redis_server import redis_container


def test_the_docker_path_imports_its_redis_container_without_a_deprecation_warning() -> None:
    # testcontainers 4.15 moved RedisContainer to testcontainers.community.redis; the old
    # module warns on import, which filterwarnings = error makes a setup error wherever
    # a Docker engine answers (a laptop), never here (no Docker): so checked here.
    sys.modules.pop("testcontainers.redis", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        container = redis_container()
    assert container.__module__ == "testcontainers.community.redis"
    assert "testcontainers.redis" not in sys.modules

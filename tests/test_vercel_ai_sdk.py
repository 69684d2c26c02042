"""The Vercel AI SDK's default OpenAI provider through a mid-stream reset.

``scripts/vercel-ai-check/check.mjs`` calls ``streamText`` and ``generateText`` with
``createOpenAI({baseURL: <gateway>})(model)``, which speaks the Responses API, with
the SDK's own retries off; the chaos upstream resets each answer once, after 12
deltas. Both calls must still get the whole answer, from a continuation the gateway
made: two upstream requests per answer, both ``POST /v1/responses``.

Needs ``node`` and ``npm``; the first run installs the pinned packages (``npm ci``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.chaos import ChaosUpstream, expected_answer
from tests.servers import RunningGateway, recovering_config, running_gateway

CHECK = Path(__file__).resolve().parent.parent / "scripts" / "vercel-ai-check"
NODE, NPM = shutil.which("node"), shutil.which("npm")
# times=1 faults only the first request carrying the exact spec, and the chaos
# upstream is the session's: one spec per call, used by no other test.
STREAM_SPEC = "chaos:text=40,seed=51,fault=reset,at=12,times=1"
GENERATE_SPEC = "chaos:text=40,seed=52,fault=reset,at=12,times=1"
NPM_TIMEOUT = 240.0
NODE_TIMEOUT = 60.0

pytestmark = pytest.mark.skipif(
    NODE is None or NPM is None,
    reason="needs node and npm on PATH (to run the Vercel AI SDK in scripts/vercel-ai-check)",
)


def _locked_versions(lockfile: Path) -> dict[str, str]:
    packages: dict[str, Any] = orjson.loads(lockfile.read_bytes())["packages"]
    return {path: entry["version"] for path, entry in packages.items() if path}


def _installed() -> bool:
    """Whether node_modules holds what package-lock.json pins (npm's own record of it)."""
    hidden = CHECK / "node_modules" / ".package-lock.json"
    if not hidden.is_file():
        return False
    return _locked_versions(hidden) == _locked_versions(CHECK / "package-lock.json")


@pytest.fixture(scope="module")
def node_modules() -> None:
    if _installed():
        return
    assert NPM is not None
    done = subprocess.run(
        [NPM, "ci", "--no-audit", "--no-fund"],
        cwd=CHECK,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    assert _installed(), "npm ci left node_modules out of date with package-lock.json"


@pytest.fixture
def recovering(chaos: ChaosUpstream) -> Iterator[RunningGateway]:
    with running_gateway(recovering_config(chaos.base_url)) as running:
        yield running


@pytest.mark.timeout(300)
def test_vercel_ai_sdk_gets_the_whole_answer_through_a_reset(
    node_modules: None, chaos: ChaosUpstream, recovering: RunningGateway
) -> None:
    assert NODE is not None
    env = os.environ | {
        "GATEWAY_URL": recovering.base_url,
        "MODEL": STREAM_SPEC,
        "GENERATE_MODEL": GENERATE_SPEC,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    done = subprocess.run(
        [NODE, "check.mjs"],
        cwd=CHECK,
        env=env,
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"check.mjs failed:\n{done.stdout}\n{done.stderr}"
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 2, done.stdout  # streamText, then generateText

    for result, spec in zip(lines, [STREAM_SPEC, GENERATE_SPEC], strict=True):
        assert result["text"] == expected_answer(spec).text
        assert result["finishReason"] == "stop"
        assert result["usage"]["outputTokens"] > 0
        # The reset reached the gateway, not the SDK: it continued the answer.
        requests = chaos.requests_for(spec)
        assert [(r.method, r.path) for r in requests] == [("POST", "/v1/responses")] * 2
        first, continuation = (r.body["input"] for r in requests)
        assert continuation[: len(first)] == first
        assert any(item.get("role") == "assistant" for item in continuation[len(first) :])

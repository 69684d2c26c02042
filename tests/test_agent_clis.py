"""Codex CLI, Claude Code, Gemini CLI, opencode, Pi and GitHub Copilot CLI through the
gateway: ``scripts/agent-cli-check/check.py``.

The check installs the pinned CLIs (``npm ci``, cached by lockfile), starts the chaos
upstream and a gateway, and runs each CLI (Codex's and Claude Code's own retries off,
Gemini CLI's as shipped) through a reset, an in-band error, a stall, a break inside
reasoning and a cut tool call (Gemini CLI also through a close, an in-band error as a
``data:`` event and a stream without ``finishReason``): each run must end as the
fault-free one does (same reasoning, messages and tool call, printed once, no extra
request from the agent; a stall over within the gateway's idle timeout), and its next
turn, which sends the first turn's items back to an upstream that checks them as the
providers do, must be answered. opencode and Pi on chat, Responses, Messages and Gemini,
Copilot CLI on chat, Responses (over HTTP and a WebSocket) and Messages, each in its
print mode through a reset, an in-band error, a stall and a reset inside reasoning (on
Gemini also Google's error as a ``data:`` event): the printed answer byte-equal to the
fault-free one, and no request of their own (Pi's retries off; opencode and Copilot
have no setting, so a retry of theirs would show as one).

Needs ``node`` and ``npm`` on PATH; skipped otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

CHECK = Path(__file__).resolve().parent.parent / "scripts" / "agent-cli-check" / "check.py"
# Codex over HTTP (a custom provider), over a WebSocket (a custom provider with
# supports_websockets, and its built-in provider with openai_base_url), Claude Code,
# Gemini CLI.
AGENTS: tuple[str, ...] = ("codex", "codex-ws", "codex-builtin", "claude", "gemini")
PROTOCOLS = ("chat", "responses", "messages", "gemini")
SOCKETS = ("codex-ws", "codex-builtin")
# Fault-free, then each fault and its next turn; Claude Code also through Anthropic
# overloaded mid-answer, finished on Bedrock.
SCENARIOS = {"codex": 1 + 2 * 5, "codex-ws": 1 + 2 * 5, "codex-builtin": 1 + 2 * 5}
SCENARIOS["claude"] = 1 + 2 * 6
SCENARIOS["gemini"] = 1 + 2 * 8 + 1  # and an answer refused mid-way, surfaced
# Print mode, one turn: fault-free, then each fault.
PRINTERS = [f"{cli}-{protocol}" for cli in ("opencode", "pi") for protocol in PROTOCOLS]
PRINTERS += [
    f"copilot-{protocol}" for protocol in ("chat", "responses", "messages", "responses-ws")
]
SCENARIOS |= {agent: 1 + 4 + agent.endswith("-gemini") for agent in PRINTERS}
AGENTS += tuple(PRINTERS)

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="needs node and npm on PATH (to install and run the agent CLIs)",
)


@pytest.mark.timeout(900)
def test_agent_clis_get_the_fault_free_answer_and_their_next_turn_is_accepted() -> None:
    done = subprocess.run(
        [sys.executable, str(CHECK)], capture_output=True, text=True, timeout=840, check=False
    )
    lines = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = [line for line in lines if not line["ok"]]
    assert done.returncode == 0 and not failed, f"{failed}\n{done.stderr[-2000:]}"
    for agent in AGENTS:
        runs = [line for line in lines if line["agent"] == agent]
        assert len(runs) == SCENARIOS[agent]
        clean = runs[0]
        assert clean["scenario"] == "fault-free"
        for run in runs[1:]:
            if run["scenario"].endswith("next turn"):
                # On a socket, a new Codex process warms it up first (no model call).
                assert run["agent_requests"] == (2 if agent in SOCKETS else 1)
            elif run["scenario"].endswith("surfaced"):  # refused: no retry, the turn ends
                assert run["agent_requests"] == run["upstream_requests"] == 1
            else:  # the fault reached the gateway, which made one more upstream request
                assert run["upstream_requests"] == clean["upstream_requests"] + 1
                assert run["agent_requests"] == clean["agent_requests"]

"""Coding agents' CLIs through the gateway, in front of the chaos upstream.

Codex three ways: a custom provider over HTTP (``codex``), a custom provider with
``supports_websockets = true`` (``codex-ws``), and its built-in OpenAI provider pointed
at the gateway with ``openai_base_url`` (``codex-builtin``), which always speaks the
Responses API over a WebSocket; both socket runs must also show no handshake retry
("Reconnecting") and no fallback to HTTP.

Installs the pinned ``@openai/codex``, ``@anthropic-ai/claude-code`` and
``@google/gemini-cli`` (package.json, package-lock.json) into a scratch prefix, starts
the chaos upstream and a gateway, and runs ``codex exec`` (its own stream retries off),
``claude -p`` (its non-streaming fallback off) and ``gemini -p`` (its own retries as
shipped: up to 4 attempts of a turn) with a scratch ``HOME``: first fault-free, then
through each fault of ``FAULTS`` (Gemini CLI: ``GEMINI_FAULTS``), comparing what the
agent ended with (its reasoning, its messages, the tool call it ran) with the
fault-free run's, and that it made no more requests than the fault-free run did (no
retry of its own); then a second turn (``codex exec resume --last``, ``claude -p
--continue``, ``gemini --resume latest``), which sends the first turn's items back to
the upstream, which checks them as the providers do (encrypted reasoning, signed
thinking, thought signatures: ``gateway/chaos/__init__.py``, ``gateway/chaos/gemini.py``).
A stall must be over within the gateway's idle timeout: its run may take no longer
than the fault-free one plus ``IDLE`` and ``STALL_SLACK``.

opencode, Pi and GitHub Copilot CLI (``PRINTED``: ``opencode-ai``,
``@earendil-works/pi-coding-agent``, ``@github/copilot``) run in their print mode, once
per protocol each speaks (``opencode-chat``, ``pi-gemini``, ``copilot-responses-ws``…),
on an answer of reasoning and text, fault-free and through ``PRINTED_FAULTS``: what each
prints must be the fault-free run's, byte for byte (no text twice: the CLI had nothing
to retry), after as many requests, and the fault-free one the chaos upstream's text.
Pi's own retries are off (``retry.enabled``); opencode and Copilot have no such
setting. Pi runs on the pinned ``node`` (22): it needs Node >= 22.19.

Prints one JSON line per run and exits 1 if any differs or fails. Usage::

    .venv/bin/python scripts/agent-cli-check/check.py [--prefix DIR] [--only AGENT|CLI]

``--prefix``: where the CLIs are installed (default: a cache directory named after
the lockfile's hash, reused by later runs); ``npm`` and ``node`` must be on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.chaos import expected_answer
from gateway.chaos.clouds import BEDROCK_CREDENTIALS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GATEWAY = ROOT / ".venv" / "bin" / "resumable-gateway"
# One answer shape for every run: reasoning (6 deltas), text (40), one tool call (4
# argument deltas); ``at`` counts those deltas in that order.
ANSWER = "text=40,reasoning=6,tools=1,arg_deltas=4"
FAULTS = {
    "reset mid-text": "fault=reset,at=20",
    "in-band error mid-text": "fault=error,at=25",
    "stall mid-text": "fault=stall,at=15,stall_s=60",
    "break inside reasoning": "fault=reset,at=3",
    "cut tool call": "fault=reset,at=48",
}
# Gemini's stream has a chunk per delta: thoughts (6, as the CLI asks includeThoughts),
# text (40), then the tool call whole in one chunk (no argument deltas): ``at=46`` cuts
# just before it. Gemini's in-band error comes two ways: Google's raw error object
# after the events (``error``), or a ``data:`` event (``error_data``).
GEMINI_FAULTS = {
    "reset mid-text": "fault=reset,at=20",
    "in-band error mid-text": "fault=error,at=25",
    "in-band error event mid-text": "fault=error_data,at=25",
    "stall mid-text": "fault=stall,at=15,stall_s=60",
    "close mid-text": "fault=close,at=30",
    "no finishReason mid-text": "fault=no_finish,at=35",
    "break inside reasoning": "fault=reset,at=3",
    "cut before the tool call": "fault=reset,at=46",
}
SEEDS = {"codex": 81, "claude": 82, "codex-ws": 83, "codex-builtin": 84, "gemini": 85}
CODEX = ("codex", "codex-ws", "codex-builtin")
# The CLIs run in their print mode, each on every protocol it speaks: ``{cli}-{protocol}``.
PROTOCOLS = {
    "opencode": ("chat", "responses", "messages", "gemini"),
    "pi": ("chat", "responses", "messages", "gemini"),
    "copilot": ("chat", "responses", "messages", "responses-ws"),
}
PRINTED = tuple(
    f"{cli}-{protocol}" for cli, protocols in PROTOCOLS.items() for protocol in protocols
)
SEEDS |= {agent: 90 + number for number, agent in enumerate(PRINTED)}
# Their answer: reasoning (6 deltas), then text (40), which is what they print.
PRINTED_ANSWER = "text=40,reasoning=6"
PRINTED_FAULTS = {
    "reset mid-text": "fault=reset,at=20",
    "in-band error mid-text": "fault=error,at=25",
    "stall mid-text": "fault=stall,at=15,stall_s=60",
    "break inside reasoning": "fault=reset,at=3",
}
# On the Gemini API, Google's in-band error both ways it comes (``GEMINI_FAULTS``).
PRINTED_GEMINI_FAULTS = PRINTED_FAULTS | {"in-band error event mid-text": "fault=error_data,at=25"}
# Where each CLI's provider for a protocol points, after the gateway's URL, and what it
# is: opencode's AI SDK provider package, Pi's ``api``, Copilot's provider settings.
OPENCODE_PROVIDERS = {
    "chat": ("@ai-sdk/openai-compatible", "/v1"),
    "responses": ("@ai-sdk/openai", "/v1"),
    "messages": ("@ai-sdk/anthropic", "/v1"),
    "gemini": ("@ai-sdk/google", "/v1beta"),
}
PI_APIS = {
    "chat": ("openai-completions", "/v1"),
    "responses": ("openai-responses", "/v1"),
    "messages": ("anthropic-messages", ""),
    "gemini": ("google-generative-ai", "/v1beta"),
}
COPILOT_PROVIDERS = {
    "chat": ("/v1", {}),
    "responses": ("/v1", {"COPILOT_PROVIDER_WIRE_API": "responses"}),
    "messages": ("", {"COPILOT_PROVIDER_TYPE": "anthropic"}),
    "responses-ws": (  # the Responses API over a WebSocket, as Codex's
        "/v1",
        {"COPILOT_PROVIDER_WIRE_API": "responses", "COPILOT_PROVIDER_TRANSPORT": "websockets"},
    ),
}
# opencode's small model (a session's title) elsewhere, as for Claude Code: else the
# title request takes the fault (times=1) and the answer is never faulted.
SMALL_MODEL = "chaos:text=3,seed=99"
# Codex's own words when a WebSocket handshake fails, or it gives the socket up.
SOCKET_TROUBLE = ("Reconnecting", "Falling back")
# Claude Code while Anthropic stays overloaded mid-answer: the gateway's route for this
# model (and only it) has no retry on Anthropic and a Bedrock leg (the chaos upstream's
# Bedrock door: SigV4, AWS event stream) asking for the same answer.
# Anthropic's answer breaks once (times=1), and the route's one Anthropic attempt is
# spent: the answer is finished on Bedrock; the turn after the tool call is Anthropic's.
OVERLOADED = "fault=error,at=30,times=1"
SECOND_TURN = "And then?"
RUN_TIMEOUT = 120.0
IDLE = 2.0  # the gateway's idle timeout on every upstream: a stall is over after it
STALL_SLACK = 2.5  # what a stalled run may take beyond the fault-free one and IDLE
AGENTS = (*CODEX, "claude", "gemini", *PRINTED)
SKIP_SIGNATURE = "skip_thought_signature_validator"  # Google's documented dummy
# Gemini CLI's settings: an API key (else 0.61 picks its ``gateway`` auth type from the
# environment and its headless mode exits 41), nothing sent to Google, no update check.
GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(url: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# -- the CLIs --------------------------------------------------------------------------


def install(prefix: Path | None) -> Path:
    """The pinned CLIs installed (``npm ci``) in ``prefix``, or in the cache; its path."""
    lock = (HERE / "package-lock.json").read_bytes()
    if prefix is None:
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        prefix = cache / "resumable-gateway" / f"agent-clis-{hashlib.sha256(lock).hexdigest()[:12]}"
    marker = prefix / "node_modules" / ".package-lock.json"
    if not marker.is_file():
        prefix.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(HERE / name, prefix / name)
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("npm is not on PATH")
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=prefix,
            check=True,
            timeout=600,
        )
    return prefix / "node_modules" / ".bin"


@dataclass
class Turn:
    """What an agent ended a turn with, as a comparable transcript."""

    ok: bool
    transcript: list[Any]
    final: str
    requests: int  # to the gateway
    detail: str = ""
    wall: float = 0.0  # seconds, the CLI's start to its exit


def codex_transcript(stdout: str) -> tuple[list[Any], str]:
    items: list[Any] = []
    final = ""
    for line in stdout.splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        item = event.get("item") or {}
        if event.get("type") == "item.completed" and item.get("type") != "error":
            items.append([item.get("type"), item.get("text")])
            if item.get("type") == "agent_message":
                final = item.get("text") or ""
    return items, final


def claude_transcript(stdout: str) -> tuple[list[Any], str]:
    items: list[Any] = []
    final = ""
    for line in stdout.splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("type") == "result":
            final = event.get("result") or ""
        if event.get("type") != "assistant":
            continue
        for block in event["message"]["content"]:
            kind = block.get("type")
            if kind == "thinking":
                items.append(["thinking", block.get("thinking")])
            elif kind == "text":
                items.append(["text", block.get("text")])
            elif kind == "tool_use":
                items.append(["tool_use", block.get("name"), block.get("input")])
    return items, final


def gemini_transcript(stdout: str) -> tuple[list[Any], str]:
    """Gemini CLI's ``stream-json``: its text deltas joined into a message until a tool
    call or the end (it prints no thoughts), each tool call and its result's status."""
    items: list[Any] = []
    text: list[str] = []
    final = ""

    def said() -> None:
        if text:
            items.append(["text", "".join(text)])
            text.clear()

    for line in stdout.splitlines():
        event = json.loads(line) if line.startswith("{") else {}
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            text.append(event.get("content") or "")
        elif kind == "tool_use":
            said()
            items.append(["tool_use", event.get("tool_name"), event.get("parameters")])
        elif kind == "tool_result":
            items.append(["tool_result", event.get("status")])
        elif kind == "result":
            said()
            if event.get("status") == "success" and items and items[-1][0] == "text":
                final = items[-1][1]
        elif kind == "error":
            items.append(["error", event.get("message")])
    said()
    return items, final


def printed_transcript(stdout: str) -> tuple[list[Any], str]:
    """What a CLI in print mode wrote: its answer, as printed, and nothing else."""
    return [stdout], stdout


class Agents:
    """The CLIs, each with its scratch HOME, pointed at the gateway."""

    def __init__(self, bin_dir: Path, gateway: str, home: Path) -> None:
        self.bin = bin_dir
        self.gateway = gateway
        self.home = home
        self.work = home / "work"
        self.work.mkdir(parents=True)
        provider = (
            'model_provider = "gateway"\n'
            'model_reasoning_summary = "auto"\n'
            "[model_providers.gateway]\n"
            'name = "gateway"\n'
            f'base_url = "{gateway}/v1"\n'
            'wire_api = "responses"\n'
            'env_key = "GATEWAY_CLIENT_KEY"\n'
            "stream_max_retries = 0\n"
            "request_max_retries = 0\n"
        )
        configs = {
            "codex": provider,
            "codex-ws": provider + "supports_websockets = true\n",
            # The built-in provider: what a user who only sets the base URL gets.
            "codex-builtin": (
                f'openai_base_url = "{gateway}/v1"\nmodel_reasoning_summary = "auto"\n'
            ),
        }
        for name, config in configs.items():
            codex_home = self.codex_home(name)
            codex_home.mkdir()
            (codex_home / "config.toml").write_text(config)
        (home / ".gemini").mkdir()
        (home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
        (home / ".pi").mkdir()
        (home / ".pi" / "settings.json").write_text(json.dumps({"retry": {"enabled": False}}))

    def codex_home(self, variant: str) -> Path:
        return self.home / ("." + variant)

    def env(self, **extra: str) -> dict[str, str]:
        keep = ("PATH", "LANG", "TERM", "SSL_CERT_FILE", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        return env | {"HOME": str(self.home), "NO_PROXY": "127.0.0.1,localhost"} | extra

    def codex(
        self, model: str, *, resume: bool = False, variant: str = "codex"
    ) -> tuple[int, str, str]:
        command = [str(self.bin / "codex"), "exec"]
        if resume:
            command += ["resume", "--last"]
        command += ["--json", "--skip-git-repo-check", "-c", f'model="{model}"']
        command.append(SECOND_TURN if resume else "Tell me, and use your tool.")
        env = self.env(
            CODEX_HOME=str(self.codex_home(variant)), GATEWAY_CLIENT_KEY="k", OPENAI_API_KEY="k"
        )
        return self._run(command, env)

    def claude(self, model: str, *, resume: bool = False) -> tuple[int, str, str]:
        command = [str(self.bin / "claude"), "-p", "--output-format", "stream-json", "--verbose"]
        command += ["--model", model]
        if resume:
            command.append("--continue")
        command.append(SECOND_TURN if resume else "Tell me, and use your tool.")
        env = self.env(
            ANTHROPIC_BASE_URL=self.gateway,
            ANTHROPIC_API_KEY="k",
            # Its small-model requests (titles, summaries) elsewhere: a spec string of its
            # own, so the faulted one counts only the answer's requests (times=1).
            ANTHROPIC_DEFAULT_HAIKU_MODEL="chaos:text=3,seed=99",
            CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK="1",
            CLAUDE_CODE_MAX_RETRIES="0",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_AUTOUPDATER="1",
        )
        return self._run(command, env)

    def gemini(self, model: str, *, resume: bool = False) -> tuple[int, str, str]:
        command = [str(self.bin / "gemini"), "--output-format", "stream-json", "-m", model]
        if resume:
            command += ["--resume", "latest"]
        command += ["-p", SECOND_TURN if resume else "Tell me, and use your tool."]
        env = self.env(
            GOOGLE_GEMINI_BASE_URL=self.gateway,
            GEMINI_API_KEY="k",
            GEMINI_CLI_TRUST_WORKSPACE="true",
            GEMINI_TELEMETRY_ENABLED="false",
        )
        return self._run(command, env)

    def printed(
        self, cli: str, protocol: str, model: str, *, resume: bool = False
    ) -> tuple[int, str, str]:
        """opencode, Pi or Copilot CLI in print mode, speaking ``protocol`` to the gateway
        (one turn: ``resume`` is there for ``turn``, which never sets it for them)."""
        prompt = "Tell me."
        if cli == "opencode":
            package, path = OPENCODE_PROVIDERS[protocol]
            provider = {
                "npm": package,
                "options": {"baseURL": self.gateway + path, "apiKey": "k"},
                "models": {model: {}, SMALL_MODEL: {}},
            }
            config = {
                "provider": {"gateway": provider},
                "small_model": f"gateway/{SMALL_MODEL}",
                "autoupdate": False,
                "share": "disabled",
            }
            command = [str(self.bin / "opencode"), "run", "-m", f"gateway/{model}", prompt]
            env = self.env(
                OPENCODE_CONFIG_CONTENT=json.dumps(config),
                OPENCODE_DISABLE_MODELS_FETCH="1",  # models.dev
                OPENCODE_DISABLE_AUTOUPDATE="1",
                OPENCODE_DISABLE_DEFAULT_PLUGINS="1",
                OPENCODE_DISABLE_LSP_DOWNLOAD="1",
            )
        elif cli == "pi":
            api, path = PI_APIS[protocol]
            provider = {"baseUrl": self.gateway + path, "api": api, "apiKey": "k"}
            models = {"providers": {"gateway": provider | {"models": [{"id": model}]}}}
            (self.home / ".pi" / "models.json").write_text(json.dumps(models))
            command = [str(self.bin / "pi"), "-p", "--no-session", "--provider", "gateway"]
            command += ["--model", model, prompt]
            env = self.env(
                PI_CODING_AGENT_DIR=str(self.home / ".pi"),
                PI_OFFLINE="1",
                PI_SKIP_VERSION_CHECK="1",
                PI_TELEMETRY="0",
                # Pi needs Node >= 22.19: the pinned ``node`` first on PATH runs it.
                PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            )
        else:
            path, settings = COPILOT_PROVIDERS[protocol]
            command = [str(self.bin / "copilot"), "-p", prompt]
            env = self.env(
                COPILOT_OFFLINE="true",
                COPILOT_PROVIDER_BASE_URL=self.gateway + path,
                COPILOT_PROVIDER_API_KEY="k",
                COPILOT_MODEL=model,
                COPILOT_AUTO_UPDATE="false",
                **settings,
            )
        return self._run(command, env)

    def _run(self, command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
        try:
            done = subprocess.run(
                command,
                cwd=self.work,
                env=env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return -1, "", f"no answer within {RUN_TIMEOUT:.0f} s (hung)"
        return done.returncode, done.stdout, done.stderr


# -- the servers -------------------------------------------------------------------------


def gateway_config(chaos: int) -> str:
    timeouts = f"{{connect: 2, first_byte: 10, idle: {IDLE}}}"
    retry = "{backoff_initial: 0.05, backoff_max: 0.2, idle_retry_delay: 0.05}"
    [(key_id, secret)] = BEDROCK_CREDENTIALS.items()
    answer = f"chaos:{ANSWER},seed={SEEDS['claude']}"
    return f"""
upstreams:
  - name: chaos
    base_url: http://127.0.0.1:{chaos}/v1
    timeouts: {timeouts}
  - name: chaos-anthropic
    kind: anthropic
    base_url: http://127.0.0.1:{chaos}
    timeouts: {timeouts}
  - name: chaos-bedrock
    kind: bedrock
    region: us-east-1
    base_url: http://127.0.0.1:{chaos}
    aws_access_key_id: {key_id}
    aws_secret_access_key: {secret}
    timeouts: {timeouts}
  - name: chaos-gemini
    kind: gemini
    base_url: http://127.0.0.1:{chaos}/v1beta
    timeouts: {timeouts}
routes:
  - match: "{answer},{OVERLOADED}"
    upstream: chaos-anthropic
    retry: {{retries: 0}}
    fallbacks: [{{upstream: chaos-bedrock, model: "{answer}"}}]
  - {{match: "*", upstream: chaos, retry: {retry}}}
  - {{match: "*", upstream: chaos-anthropic, retry: {retry}}}
  - {{match: "*", upstream: chaos-gemini, retry: {retry}}}
"""


@dataclass
class Servers:
    gateway: str
    chaos: str

    def recorded(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.chaos}/v1/_chaos/requests", timeout=5) as answer:
            recorded: list[dict[str, Any]] = json.loads(answer.read())
        return recorded

    def upstream_requests(self, model: str) -> list[dict[str, Any]]:
        """The requests the chaos upstream received for ``model``, in order."""
        return [
            r
            for r in self.recorded()
            if isinstance(r["body"], dict) and r["body"].get("model") == model
        ]

    def bedrock_requests(self) -> list[dict[str, Any]]:
        """The requests that came by the chaos upstream's Bedrock door."""
        return [r for r in self.recorded() if r.get("dialect") == "bedrock"]


@contextlib.contextmanager
def servers(scratch: Path) -> Iterator[Servers]:
    """The chaos upstream and a gateway in front of it."""
    chaos_port, gateway_port = free_port(), free_port()
    config = scratch / "gateway.yaml"
    config.write_text(gateway_config(chaos_port))
    log = (scratch / "servers.log").open("w")
    env = os.environ | {"NO_PROXY": "127.0.0.1,localhost"}
    processes = [
        subprocess.Popen(
            [str(GATEWAY), "chaos-upstream", "--port", str(chaos_port)], stdout=log, stderr=log
        ),
        subprocess.Popen(
            [str(GATEWAY), "serve", "--config", str(config), "--port", str(gateway_port)],
            stdout=log,
            stderr=log,
            env=env,
        ),
    ]
    try:
        url = f"http://127.0.0.1:{gateway_port}"
        wait_for(f"{url}/readyz")
        yield Servers(url, f"http://127.0.0.1:{chaos_port}")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        log.close()


def client_requests(gateway: str) -> int:
    """Requests the gateway has answered so far (its /metrics)."""
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("gateway_requests_total{") and (
            'method="POST"' in line or 'method="WS"' in line  # a response.create on a socket
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


# -- the check ---------------------------------------------------------------------------


def turn(
    servers: Servers,
    run: Callable[..., tuple[int, str, str]],
    transcript: Callable[[str], tuple[list[Any], str]],
    model: str,
    *,
    resume: bool = False,
    watch: tuple[str, ...] = SOCKET_TROUBLE,
) -> Turn:
    before = client_requests(servers.gateway)
    start = time.monotonic()
    code, stdout, stderr = run(model, resume=resume)
    wall = time.monotonic() - start
    requests = client_requests(servers.gateway) - before
    items, final = transcript(stdout)
    detail = "" if code == 0 else (stderr.strip().splitlines() or [f"exit {code}"])[-1]
    trouble = [line for line in stderr.splitlines() if any(t in line for t in watch)]
    if trouble:  # a socket the gateway refused or dropped: Codex retried or went to HTTP
        detail = trouble[0]
    ok = code == 0 and bool(final) and not trouble
    return Turn(ok, items, final, requests, detail[:300], round(wall, 2))


def sent_back(agent: str, request: dict[str, Any]) -> int:
    """The items of the first turn's two responses a request sends back to the upstream:
    Codex's reasoning items, each with its encrypted_content; Claude Code's assistant
    messages (it keeps their text and tool uses, and drops thinking blocks from its
    history; any it sent would need their signature, which the upstream checks);
    Gemini CLI's ``model`` contents (it keeps text and function calls; a resumed
    session's calls carry Google's dummy signature, see ``relayed_signature``)."""
    body = request["body"]
    if agent == "gemini":
        return sum(1 for content in body.get("contents", []) if content.get("role") == "model")
    if agent in CODEX:
        return sum(
            1
            for item in body.get("input", [])
            if item.get("type") == "reasoning" and item.get("encrypted_content")
        )
    return sum(1 for message in body.get("messages", []) if message.get("role") == "assistant")


def relayed_signature(requests: list[dict[str, Any]]) -> bool:
    """Whether Gemini CLI sent the tool call back with the signature it came with: the
    upstream checks any signature (a corrupted one is refused), but Gemini CLI puts
    Google's dummy on a call of the current turn that came without one, which the
    upstream takes too. So the request with the tool's result must carry a real one."""
    for request in requests:
        contents = request["body"].get("contents", [])
        parts = [part for content in contents for part in content.get("parts", [])]
        if parts and "functionResponse" in parts[-1]:
            signatures = [part.get("thoughtSignature") for part in parts if "functionCall" in part]
            return any(signature not in (None, SKIP_SIGNATURE) for signature in signatures)
    return False


def check(agent: str, agents: Agents, servers: Servers) -> bool:
    run: Callable[..., tuple[int, str, str]]
    transcript: Callable[[str], tuple[list[Any], str]]
    printed = agent in PRINTED
    if agent in CODEX:
        run, transcript = functools.partial(agents.codex, variant=agent), codex_transcript
    elif agent == "gemini":
        run, transcript = agents.gemini, gemini_transcript
    elif printed:
        run = functools.partial(agents.printed, *agent.split("-", 1))
        transcript = printed_transcript
    else:
        run, transcript = agents.claude, claude_transcript
    # Only Codex's socket trouble is watched: Gemini CLI says "Falling back to GrepTool"
    # (no ripgrep here), which is not a socket's.
    run_turn = functools.partial(turn, watch=SOCKET_TROUBLE if agent in CODEX else ())
    answer = f"chaos:{PRINTED_ANSWER if printed else ANSWER},seed={SEEDS[agent]}"
    clean = run_turn(servers, run, transcript, answer)
    if agent == "gemini" and not relayed_signature(servers.upstream_requests(answer)):
        clean.ok, clean.detail = False, "the tool call went back without its signature"
    if printed and clean.final.strip() != expected_answer(answer).text.strip():
        clean.ok, clean.detail = False, "printed another answer than the upstream's"
    report(agent, "fault-free", clean.ok, clean, len(servers.upstream_requests(answer)))
    passed = clean.ok
    chosen = FAULTS
    if agent == "gemini":
        chosen = GEMINI_FAULTS
    elif printed:
        chosen = PRINTED_GEMINI_FAULTS if agent.endswith("-gemini") else PRINTED_FAULTS
    faults = {name: f"{fault},times=1" for name, fault in chosen.items()}
    if agent == "claude":
        faults["overloaded mid-text, finished on Bedrock"] = OVERLOADED
    for number, (name, fault) in enumerate(faults.items()):
        model = f"{answer},{fault}"
        bedrock = len(servers.bedrock_requests())
        first = run_turn(servers, run, transcript, model)
        # Whole: the same reasoning, messages and tool call as without the fault, and no
        # request more from the agent (no retry of its own: the gateway recovered).
        same = first.transcript == clean.transcript and first.requests == clean.requests
        if agent == "gemini" and not relayed_signature(servers.upstream_requests(model)):
            same, first.detail = False, "the tool call went back without its signature"
        if "stall" in name:  # over within the gateway's idle timeout, not the CLI's
            same = same and first.wall <= clean.wall + IDLE + STALL_SLACK
        # Its upstream requests, and any continuation on Bedrock (which asks for the
        # answer by its model id there, without the fault).
        upstream = len(servers.upstream_requests(model))
        upstream += len(servers.bedrock_requests()) - bedrock
        if printed and first.ok and not same:  # the text twice (a retry of its own), or cut
            first.detail = (
                f"printed {len(first.final)} characters after {first.requests} requests"
                f" (fault-free: {len(clean.final)} after {clean.requests})"
            )
        report(agent, name, first.ok and same, first, upstream)
        passed = passed and first.ok and same
        if printed:  # one turn: what it printed is what a user of print mode gets
            continue
        # The next turn sends this turn's items back, and the upstream must accept them.
        again = f"chaos:text=8,seed={SEEDS[agent] * 100 + number}"
        second = run_turn(servers, run, transcript, again, resume=True)
        [request] = servers.upstream_requests(again) or [{"body": {}}]
        accepted = second.final.strip() == expected_answer(again).text.strip()
        returned = sent_back(agent, request) >= 2  # both of the first turn's responses
        report(agent, f"{name}, next turn", second.ok and accepted and returned, second, 1)
        passed = passed and second.ok and accepted and returned
    if agent == "gemini":
        passed = surfaced(servers, run_turn, run, transcript, answer, clean) and passed
    return passed


def surfaced(
    servers: Servers,
    run_turn: Callable[..., Turn],
    run: Callable[..., tuple[int, str, str]],
    transcript: Callable[[str], tuple[list[Any], str]],
    answer: str,
    clean: Turn,
) -> bool:
    """An answer the gateway cannot complete (the upstream refuses it mid-answer, a 400):
    Gemini CLI raises the error the stream ends with and ends the turn on it, as against
    Google: one request (no retry of its own), an exit status that says so, the text it
    had printed once, never a success."""
    model = f"{answer},fault=error_fatal,at=25,times=1"
    result = run_turn(servers, run, transcript, model)
    printed = "".join(item[1] for item in result.transcript if item[0] == "text")
    whole = "".join(item[1] for item in clean.transcript if item[0] == "text")
    # ``detail`` is the last line of its stderr when its exit status is not 0.
    failed = not result.final and bool(result.detail)
    ok = failed and result.requests == 1 and bool(printed) and whole.startswith(printed)
    if not ok:
        result.detail = f"printed {printed!r}: {result.detail}"
    report("gemini", "refused mid-answer, surfaced", ok, result, 1)
    return ok


def report(agent: str, scenario: str, ok: bool, result: Turn, upstream: int) -> None:
    line = {
        "agent": agent,
        "scenario": scenario,
        "ok": ok,
        "agent_requests": result.requests,
        "upstream_requests": upstream,
        "wall_s": result.wall,
    }
    if not ok:
        line |= {"final": result.final[:200], "detail": result.detail}
    print(json.dumps(line, ensure_ascii=False), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=Path, help="where to install the CLIs")
    parser.add_argument(
        "--only", choices=(*AGENTS, *PROTOCOLS), help="an agent, or a CLI on all its protocols"
    )
    args = parser.parse_args()
    bin_dir = install(args.prefix)
    with tempfile.TemporaryDirectory(prefix="agent-cli-check-") as scratch:
        with servers(Path(scratch)) as running:
            agents = Agents(bin_dir, running.gateway, Path(scratch) / "home")
            names = list(AGENTS)
            if args.only in PROTOCOLS:
                names = [f"{args.only}-{protocol}" for protocol in PROTOCOLS[args.only]]
            elif args.only:
                names = [args.only]
            results = [check(name, agents, running) for name in names]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

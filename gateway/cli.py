"""``resumable-gateway``: serve | chaos-upstream | check-config | demo."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import logging.config
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.app import CONFIG_ENV
from gateway.config.load import default_config, load_config
from gateway.config.schema import ConfigError, GatewayConfig
from gateway.describe import describe
from gateway.logs import config as logging_config
from gateway.otel_env import check_protocol, tracing_enabled
from gateway.upstream.client import UpstreamClient
from gateway.upstream.headers import OWN_CREDENTIALS
from gateway.upstream.providers import check_providers
from gateway.upstream.reach import check_reach
from gateway.upstream.routes import ResolvedLeg

logger = logging.getLogger(__name__)


def _load(path: str | None) -> GatewayConfig:
    return load_config(path) if path else default_config()


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name, "" (all interfaces in some stacks): assume reachable


def open_proxy_warning(config: GatewayConfig, host: str) -> str | None:
    """What to warn about when anyone who reaches ``host`` can spend an upstream's key.

    That is: an upstream holds a credential of its own (``api_key``, or an
    ``Authorization`` / ``api-key`` / ``x-api-key`` header), the gateway asks clients
    for no key (``auth.keys`` empty), and it listens beyond loopback. The message
    names the upstreams, never their keys. None when there is nothing to warn about.
    """
    if config.auth.keys or is_loopback(host):
        return None
    keyed = [
        upstream.name
        for upstream in config.upstreams
        if (upstream.api_key is not None and upstream.api_key.get_secret_value())
        or {name.lower() for name in upstream.headers} & OWN_CREDENTIALS
    ]
    if not keyed:
        return None
    names = ", ".join(repr(name) for name in keyed)
    return (
        f"open proxy: listening on {host} with no gateway keys (auth.keys is empty), so "
        f"anyone who can reach it spends the API key of upstream {names}. To fix: set "
        "gateway keys that clients must send (GATEWAY_KEYS=k1,k2 with the embedded "
        "defaults, or auth.keys in a config file), or listen on loopback only "
        "(--host 127.0.0.1)."
    )


def default_workers(config: GatewayConfig) -> int:
    """One worker per CPU this process may use when runs live in Redis, where any
    worker can resume any run; else one: a run checkpointed in one process's memory is
    found only there (a resume that reached another worker would get 404).

    The CPUs it may use: its affinity (``taskset``, cpusets), and no more than a
    cgroup's CPU quota rounded up (a container's ``--cpus``, a pod's CPU limit)."""
    if config.state.backend != "redis":
        return 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    usable = usable or os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(usable, math.ceil(quota))) if quota is not None else usable


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup, in CPUs; None where there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # cgroup v2
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.serve import serve

    config = _load(args.config)  # fail fast, in the parent, with a clear message
    check_reach(config.upstreams)  # proxies, certificate files
    check_providers(config.upstreams)  # botocore, google-auth where a cloud needs them
    if tracing_enabled(config.tracing, os.environ):
        check_protocol(os.environ)  # OTLP over HTTP
    host = args.host or config.listen.host
    if warning := open_proxy_warning(config, host):
        # Once, from the parent (not once per worker), formatted as every other line:
        # uvicorn applies the same logging config again when it starts.
        level = args.log_level or config.logging.level
        logging.config.dictConfig(logging_config(level, args.log_format or config.logging.format))
        logger.warning(warning)
    serve(
        config,
        config_path=args.config,
        host=host,
        port=args.port,
        workers=args.workers or default_workers(config),
        log_level=args.log_level,
        log_format=args.log_format,
    )
    return 0


def cmd_chaos_upstream(args: argparse.Namespace) -> int:
    from gateway.chaos import run

    run(args.host, args.port)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo(quick=args.quick)


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args.file)
    print(describe(config))
    check_reach(config.upstreams)  # the certificate files are read, as serve reads them
    check_providers(config.upstreams)
    for line in asyncio.run(_learned_continuations(config)):
        print(line)
    for line in _background_responses(config):
        print(line)
    if tracing_enabled(config.tracing, os.environ):
        check_protocol(os.environ)
    print("config OK")
    return 0


# check-config's look at each ``auto`` upstream's server: brief.
_PROBE_TIMEOUTS = {"connect": 3.0, "first_byte": 3.0}


async def _learned_continuations(config: GatewayConfig) -> list[str]:
    """What each ``continuation: auto`` upstream's server takes, asked as a run would
    (``GET /models``), all at once and briefly: a server not up yet says prompt."""
    auto = [u for u in config.upstreams if u.continuation == "auto"]
    if not auto:
        return []
    client = UpstreamClient(auto, config.limits)
    try:
        found = await asyncio.gather(
            *(
                client.probe_continuation(
                    ResolvedLeg(u, "", u.timeouts.model_copy(update=_PROBE_TIMEOUTS))
                )
                for u in auto
            )
        )
    finally:
        await client.aclose()
    return [
        f"continuation of {u.name}: auto -> {mode} ({why})"
        for u, (mode, why) in zip(auto, found, strict=True)
    ]


def _background_responses(config: GatewayConfig) -> list[str]:
    """Whether each Responses upstream that could asks background responses, and why."""
    lines = []
    for u in config.upstreams:
        if "responses" not in u.protocols or u.kind not in ("openai", "azure"):
            continue
        why = "set" if u.background is not None else f"default for {u.kind} at this base_url"
        lines.append(
            f"background responses of {u.name}: {'on' if u.runs_background else 'off'} ({why})"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resumable-gateway",
        description="An OpenAI-compatible gateway that recovers LLM streams that break mid-way.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the gateway",
        description="Run the gateway. Without --config: embedded defaults (one upstream from "
        "GATEWAY_UPSTREAM_BASE_URL / GATEWAY_UPSTREAM_API_KEY, in-memory state, no Redis).",
    )
    serve.add_argument("--config", metavar="FILE", default=os.environ.get(CONFIG_ENV))
    serve.add_argument("--host", help="listen address (default: listen.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default: listen.port, 8080)")
    serve.add_argument(
        "--workers",
        type=int,
        help="worker processes (default: one per CPU this process may use with Redis "
        "state, else 1)",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="default: logging.level (info)",
    )
    serve.add_argument(
        "--log-format",
        choices=["auto", "json", "text"],
        help="default: logging.format (auto: text on a terminal, else JSON lines)",
    )
    serve.set_defaults(func=cmd_serve)

    chaos = commands.add_parser(
        "chaos-upstream",
        help="run the fault-injecting OpenAI-compatible upstream (tests, benchmarks, demo)",
        description="Serve deterministic chat completions and inject transport faults chosen "
        "by the model name, e.g. model 'chaos:text=40,fault=reset,at=12,times=1'.",
    )
    chaos.add_argument("--host", default="127.0.0.1")
    chaos.add_argument("--port", type=int, default=9000)
    chaos.set_defaults(func=cmd_chaos_upstream)

    demo = commands.add_parser(
        "demo",
        help="watch the gateway rescue streams broken on purpose (no API key, about 16 s)",
        description="Start the chaos upstream and a gateway in this process, stream answers the "
        "upstream breaks on purpose, and show what the client received, what broke and how it "
        "was rescued. Exit status 0 when every answer arrived as it should.",
    )
    demo.add_argument("--quick", action="store_true", help="no pacing between deltas (tests)")
    demo.set_defaults(func=cmd_demo)

    check = commands.add_parser(
        "check-config",
        help="validate a config file and print the resolved routes (secrets masked)",
    )
    check.add_argument("file", nargs="?", help="config file (default: embedded defaults)")
    check.set_defaults(func=cmd_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"resumable-gateway: {exc}", file=sys.stderr)
        return 2
    return code

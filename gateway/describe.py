"""``check-config``'s summary of a config: every upstream as it will be reached, every
route's legs, the state and logging settings, with every secret masked.

Apart from ``config``: saying how an upstream is reached takes ``upstream.reach``,
which builds on ``config``.
"""

from __future__ import annotations

from pydantic import SecretStr

from gateway.config.schema import GatewayConfig, mask, mask_url
from gateway.upstream.reach import reach_of


def describe(config: GatewayConfig) -> str:
    """A human-readable summary with every secret masked (``check-config``)."""
    lines = [f"listen: {config.listen.host}:{config.listen.port}", "upstreams:"]
    for u in config.upstreams:
        t = u.timeouts
        key = mask(u.api_key) if u.api_key else "(client's key passed through)"
        c = u.circuit
        circuit = f"circuit({c.failures} failures, {c.cooldown:g}s)" if c.failures else "no circuit"
        lines.append(
            f"  {u.name}: {u.root} ({u.kind}: {', '.join(u.protocols)})  key={key}  "
            f"continuation={u.continuation}  "
            f"timeouts(connect={t.connect:g}s first_byte={t.first_byte:g}s idle={t.idle:g}s)  "
            + circuit
        )
        lines.append(f"    reached: {reach_of(u).describe()}")
        lines.extend(f"    header {h}: {mask(v)}" for h, v in u.headers.items())
        lines.extend(
            f"    continuation for {glob}: {mode}" for glob, mode in u.continuation_models.items()
        )
    lines.append("routes (first match wins):")
    for route in config.effective_routes:
        legs = " -> ".join(
            f"{leg.upstream}/{leg.model or '<requested>'}"
            + (f" ({leg.continuation})" if leg.continuation else "")
            for leg in route.legs
        )
        extra = []
        if route.timeouts is not None:
            overrides = route.timeouts.model_dump(exclude_none=True)
            extra.append("timeouts(" + " ".join(f"{k}={v:g}s" for k, v in overrides.items()) + ")")
        if route.min_throughput is not None:
            m = route.min_throughput
            extra.append(
                f"min_throughput({m.chars_per_s:g} chars/s over {m.window:g}s after {m.grace:g}s)"
            )
        lines.append(f"  {route.match}: {legs}" + "".join("  " + e for e in extra))
    auth = f"{len(config.auth.keys)} gateway key(s)" if config.auth.keys else "pass-through"
    lines.append(f"auth: {auth}")
    state = config.state
    where = {
        "redis": "redis " + mask_url(state.redis_url) if state.redis_url else "",
        "memory": "memory",
        "off": "off",
    }
    lines.append(
        f"state: {where[state.backend]}  checkpoint_every={state.checkpoint_every}  "
        f"detach_grace={state.detach_grace:g}s  lease_ttl={state.lease_ttl:g}s"
    )
    log = config.logging
    lines.append(
        f"logging: {log.level} {log.format}{'  content=ON' if log.content else ''}  "
        f"drain_timeout={config.listen.drain_timeout:g}s"
    )
    tracing = config.tracing
    on = {True: "on", False: "off", None: "on when OTEL_EXPORTER_OTLP_ENDPOINT is set"}
    lines.append(
        f"tracing: {on[tracing.enabled]}"
        + (f"  endpoint={mask_url(SecretStr(tracing.endpoint))}" if tracing.endpoint else "")
        + ("  content=ON" if tracing.capture_content else "")
    )
    return "\n".join(lines)

"""Whether traces are on, and whether the environment asks for what the gateway can
send: the switches of gateway/tracing.py, without importing the OpenTelemetry SDK
(about 150 ms and its memory in every worker, where tracing is off by default)."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config.schema import ConfigError
from gateway.config.schema import Tracing as TracingConfig

TRUE = ("true", "1", "yes", "on")


def tracing_enabled(config: TracingConfig, env: Mapping[str, str]) -> bool:
    """Whether this process traces: the config says so, or the environment names an
    OTLP endpoint (and neither the config nor ``OTEL_SDK_DISABLED`` says no)."""
    if env.get("OTEL_SDK_DISABLED", "").lower() in TRUE or config.enabled is False:
        return False
    if config.enabled:
        return True
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return bool(endpoint) and env.get("OTEL_TRACES_EXPORTER", "otlp").lower() != "none"


def check_protocol(env: Mapping[str, str]) -> None:
    """OTLP over HTTP with protobuf is what the gateway exports; say so at start-up
    instead of sending protobuf to a gRPC port."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(name)
        if protocol:
            if protocol != "http/protobuf":
                raise ConfigError(
                    f"{name}={protocol}: the gateway exports traces over OTLP/HTTP with "
                    "protobuf only; set it to http/protobuf and point the endpoint at the "
                    "collector's HTTP port (4318)"
                )
            return

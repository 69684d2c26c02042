"""The docs' generated references: every key of the config and every metric, from the code."""

from __future__ import annotations

from pydantic import BaseModel

from gateway.config.schema import GatewayConfig, State
from gateway.metrics import Metrics
from gateway.reference import config_reference, metrics_reference


def keys(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_the_config_reference_has_every_key_with_its_default_and_meaning() -> None:
    text = config_reference()
    for section in ("listen", "upstreams[]", "routes[]", "auth", "limits", "state", "logging"):
        assert f"## `{section}`" in text, section
    for name in keys(State):
        assert f"| `{name}` |" in text, name
    # The default and the comment the model has on the key.
    row = next(line for line in text.splitlines() if line.startswith("| `wait_timeout` |"))
    assert "`2.0`" in row and "waits for them" in row and "(gt 0)" in row
    # A nested model is described once under its own heading, with its path.
    assert "## `upstreams[].timeouts`" in text
    assert text.count("| `base_url` |") == 1
    assert set(GatewayConfig.model_fields) <= {
        line.split("`")[1] for line in text.splitlines() if line.startswith("| `")
    }


def test_the_metrics_reference_lists_every_metric_the_gateway_registers() -> None:
    text = metrics_reference()
    registered = {
        family.name for family in Metrics().registry.collect() if family.name.startswith("gateway_")
    }
    listed = {line.split("`")[1].removesuffix("_total") for line in text.splitlines()[6:]}
    assert registered and registered <= listed, registered - listed
    assert "| `gateway_checkpoint_writes_total` | counter | `result` |" in text

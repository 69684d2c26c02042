"""Metric children are remembered by label values, and count as prometheus-client's do."""

from __future__ import annotations

from gateway.metrics import Metrics


def test_remembered_children_count_into_the_same_series() -> None:
    metrics = Metrics()
    first = metrics.requests.labels("r", "POST", "200")
    assert metrics.requests.labels("r", "POST", "200") is first
    first.inc()
    metrics.requests.labels("r", "POST", "200").inc(2)
    metrics.requests.labels(route="r", method="POST", status="200").inc()  # by name: not memo
    metrics.ttft.labels("r").observe(0.2)
    registry = metrics.registry
    labels = {"route": "r", "method": "POST", "status": "200"}
    assert registry.get_sample_value("gateway_requests_total", labels) == 4
    assert registry.get_sample_value("gateway_requests_total", labels | {"status": "500"}) is None
    assert (
        registry.get_sample_value("gateway_time_to_first_token_seconds_count", {"route": "r"}) == 1
    )

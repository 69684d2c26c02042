"""The Grafana dashboard, drawn from its own queries over a real run (see pictures.traffic)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import promql_parser
from prometheus_client.parser import text_string_to_metric_families

from pictures import traffic
from pictures.panels import Series, dashboard_svg
from pictures.promql import Evaluator, Labels, Scrape

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "resumable-gateway.json"
JOB = "resumable-gateway"  # the scrape job the deploy/ configs name
SCRAPE_INTERVAL = 1.0
RATE_INTERVAL = "10s"  # $__rate_interval: Grafana's is four scrape intervals at least


@dataclass
class Scraper:
    """Scrapes every replica's /metrics, as Prometheus would, labelling job and instance."""

    replicas: dict[str, str]
    scrapes: list[Scrape]

    def __call__(self, at: float) -> None:
        samples: dict[str, dict[Labels, float]] = defaultdict(dict)
        for instance, url in self.replicas.items():
            text = httpx2.get(url + "/metrics", timeout=5).text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    labels = {**sample.labels, "job": JOB, "instance": instance}
                    samples[sample.name][frozenset(labels.items())] = sample.value
        self.scrapes.append(Scrape(at, samples))


def record() -> tuple[list[Scrape], bool]:
    """Scrapes of both replicas over the traffic; whether checkpoints went to Redis."""
    scrapes: list[Scrape] = []
    with traffic.deployment() as deployment:
        traffic.drive(deployment, Scraper(deployment.replicas, scrapes), SCRAPE_INTERVAL)
    return scrapes, deployment.redis


def panel_query(expr: str, seconds: float) -> promql_parser.Expr:
    """A panel's query as Grafana sends it: variables replaced ($instance: All)."""
    expr = expr.replace('=~"$instance"', '=~".*"')
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    expr = expr.replace("$__range", f"{round(seconds)}s")
    return promql_parser.parse(expr)


def _legend(template: str, labels: Labels) -> str:
    values = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: values.get(m[1], ""), template).strip()


def panel_series(panel: dict[str, Any], scrapes: list[Scrape]) -> list[Series]:
    """Each of a panel's series over the run: one point per scrape."""
    evaluator = Evaluator(scrapes)
    seconds = scrapes[-1].at
    found: dict[str, dict[float, float]] = {}
    for target in panel.get("targets", []):
        expr = panel_query(target["expr"], seconds)
        for scrape in scrapes:
            for labels, value in evaluator.evaluate(expr, scrape.at).items():
                name = _legend(target.get("legendFormat", ""), labels) or target["expr"]
                found.setdefault(name, {})[scrape.at] = value
    return [Series(name, sorted(points.items())) for name, points in sorted(found.items())]


def write(folder: Path) -> list[Path]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    scrapes, redis = record()
    series = {
        panel["id"]: panel_series(panel, scrapes) for panel in board["panels"] if "targets" in panel
    }
    state = "Redis" if redis else "in-memory state"
    caption = (
        f"{len(scrapes)} scrapes of two replicas ({state}) in front of the chaos upstream, "
        f"{traffic.DURATION:g} s of traffic with a provider incident from "
        f"{traffic.INCIDENT[0]:g} s to {traffic.INCIDENT[1]:g} s (shaded); each panel its own query"
    )
    path = folder / "dashboard.svg"
    path.write_text(dashboard_svg(board, series, caption, traffic.INCIDENT), encoding="utf-8")
    return [path]

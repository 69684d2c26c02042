"""The docs' pictures (``python -m pictures``): they can be made again, and what is committed
is what the pages show. Regenerating them takes a minute of real traffic, so it is not done
here; what is checked is that every dashboard query can be drawn, and drawn right."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import promql_parser
import pytest

from gateway.demo.report import columns
from pictures.dashboard import DASHBOARD, panel_query
from pictures.panels import Series, dashboard_svg, formatted
from pictures.promql import Evaluator, Scrape, Unsupported, histogram_quantile
from pictures.terminal import FONT_SIZE, PAD, Style, styled_runs, terminal_svg

ROOT = Path(__file__).resolve().parent.parent
PICTURES = ROOT / "docs" / "pictures"


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())


SCRAPES = [
    Scrape(0.0, {}),
    Scrape(
        10.0,
        {
            "gateway_requests_total": {labels(status="200", instance="a"): 20.0},
            "gateway_recoveries_total": {
                labels(outcome="recovered", plan="continue_text", instance="a"): 3.0,
                labels(outcome="failed", plan="continue_text", instance="a"): 1.0,
            },
            "gateway_ready": {labels(instance="a"): 1.0, labels(instance="b"): 1.0},
        },
    ),
]


def test_every_panel_query_is_one_the_pictures_can_evaluate() -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    evaluator = Evaluator(SCRAPES)
    targets = [t for panel in board["panels"] for t in panel.get("targets", [])]
    assert len(targets) > 20
    for target in targets:
        evaluator.evaluate(panel_query(target["expr"], 10.0), 10.0)  # Unsupported if not


def test_rate_increase_sum_and_division() -> None:
    evaluator = Evaluator(SCRAPES)

    def value(expr: str) -> float:
        (only,) = evaluator.evaluate(promql_parser.parse(expr), 10.0).values()
        return only

    assert value("sum(rate(gateway_requests_total[10s]))") == 2.0
    assert value("sum(gateway_ready)") == 2.0
    success = (
        'sum(increase(gateway_recoveries_total{outcome="recovered"}[10s]))'
        " / sum(increase(gateway_recoveries_total[10s]))"
    )
    assert value(success) == 0.75
    by_outcome = evaluator.evaluate(
        promql_parser.parse("sum by (outcome) (gateway_recoveries_total)"), 10.0
    )
    assert by_outcome == {labels(outcome="recovered"): 3.0, labels(outcome="failed"): 1.0}
    with pytest.raises(Unsupported):
        evaluator.evaluate(promql_parser.parse("max(gateway_ready)"), 10.0)


def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    buckets = {
        labels(le="0.1"): 50.0,
        labels(le="0.5"): 90.0,
        labels(le="1.0"): 100.0,
        labels(le="+Inf"): 100.0,
    }
    (median,) = histogram_quantile(0.5, buckets).values()
    assert median == pytest.approx(0.1)
    (p90,) = histogram_quantile(0.9, buckets).values()
    assert p90 == pytest.approx(0.5)
    (p95,) = histogram_quantile(0.95, buckets).values()
    assert p95 == pytest.approx(0.75)
    (empty,) = histogram_quantile(0.5, {labels(le="+Inf"): 0.0}).values()
    assert math.isnan(empty)


def test_units_as_grafana_writes_them() -> None:
    assert formatted(0.862, "percentunit") == "86.2%"
    assert formatted(0.025, "s") == "25 ms"
    assert formatted(2.5, "s") == "2.5 s"
    assert formatted(8.4, "reqps") == "8.4 req/s"
    assert formatted(125_000, "Bps") == "125 kB/s"
    assert formatted(math.nan, "short") == "No data"


def test_terminal_colours_and_wide_characters_keep_their_columns() -> None:
    runs, after = styled_runs("\033[2mmodel\033[0m 数据 \033[32;1myes\033[0m")
    assert after == Style()
    assert [(r.column, r.text, r.dim, r.bold, r.colour is not None) for r in runs] == [
        (0, "model", True, False, False),
        (5, " 数据 ", False, False, False),
        (11, "yes", False, True, True),
    ]
    # A colour set on one line goes on over the next, as in a terminal.
    (cyan,), _ = styled_runs("}", styled_runs("\033[36mtext")[1])
    assert cyan.colour is not None
    ElementTree.fromstring(terminal_svg("\033[1mbold\033[0m & <plain>\n", "t", 40))


SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[tuple[float, str, float]]:
    """(x, text, textLength) of every line of terminal text in a picture."""
    root = ElementTree.fromstring(svg)
    return [
        (float(t.attrib["x"]), t.text or "", float(t.attrib["textLength"]))
        for t in root.iter(SVG + "text")
        if "textLength" in t.attrib
    ]


def test_a_stretched_text_covers_only_what_browsers_draw() -> None:
    # A label padded to its column, an indent, a run of spaces inside a line: SVG text
    # drops the spaces at its ends and collapses runs (Chromium whatever xml:space says),
    # so textLength over them spread the letters ("m o d e l", issue 48).
    output = "\033[2mmodel     \033[0msmollm2  (greedy)\n               answer\n"
    svg = terminal_svg(output, "t", 40)
    cell = FONT_SIZE * 0.6
    drawn = [(round((x - PAD) / cell), text, length) for x, text, length in texts(svg)]
    assert [(column, text) for column, text, _ in drawn] == [
        (0, "model"),
        (10, "smollm2"),
        (19, "(greedy)"),
        (15, "answer"),
    ]
    for _, text, length in drawn:
        assert length == pytest.approx(len(text) * cell)


@pytest.mark.parametrize("name", ["demo.svg", "demo-real-model.svg"])
def test_the_committed_terminal_pictures_stretch_no_text_over_spaces(name: str) -> None:
    for _, text, length in texts((PICTURES / name).read_text(encoding="utf-8")):
        assert text == text.strip() and "  " not in text, repr(text)
        assert length == pytest.approx(columns(text) * FONT_SIZE * 0.6), repr(text)


def test_the_front_page_shows_a_real_model_answer_surviving_a_killed_server() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "](pictures/demo-real-model.svg)" in index
    shown = " ".join(text for _, text, _ in texts((PICTURES / "demo-real-model.svg").read_text()))
    assert "A real model: SmolLM2-135M-Instruct" in shown
    assert "server A, with SIGKILL, after" in shown and "mid-sentence" in shown
    assert "The sky is blue because" in shown  # the model's words, not the chaos upstream's
    assert "then server B: 1 answered" in shown
    assert "identical to the unbroken answer, byte for byte" in shown and shown.endswith("yes")


def test_a_dashboard_draws_as_valid_svg() -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    some = [Series("a & b", [(0.0, 1.0), (1.0, math.nan), (2.0, 3.0)])]
    series = {p["id"]: some for p in board["panels"] if "targets" in p}
    ElementTree.fromstring(dashboard_svg(board, series, "caption <x>", (0.5, 1.5)))


@pytest.mark.parametrize("name", ["demo.svg", "demo-real-model.svg", "dashboard.svg"])
def test_the_committed_pictures_are_svg_the_pages_show(name: str) -> None:
    root = ElementTree.parse(PICTURES / name).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    pages = [p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md")]
    assert any(f"pictures/{name}" in page for page in pages)

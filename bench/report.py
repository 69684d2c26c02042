"""Render benchmark results as markdown tables and a chart.

    from bench import report
    paths = report.write(results, Path("bench/out"))  # results.json, results.md, chart.png

`results` is the dict built by `bench/__main__.py` (times in ms, rates per second).
Any section or config may be missing and any value may be None; those print as "—"
in the tables and are left out of the chart.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullLocator

Results = dict[str, Any]
Row = Mapping[str, Any]
Cell = Callable[[Row], str]

BASELINE = "direct"
DASH = "—"
STALL_MS = 40
GAP_TARGET_MS = 5.0
TTFT_TARGETS_MS = {"p50": 1.0, "p99": 2.0}
PACE_CHUNKS, PACE_INTERVALS, PACE_S = 64, 66, 0.020
LINTHRESH = 1.0
PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


# ---------------------------------------------------------------- formatting


def _fmt(spec: str) -> Callable[[object], str]:
    """A formatter for numbers with `spec`; anything else (None, NaN, text) is a dash."""

    def fmt(value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return DASH
        if not math.isfinite(value):
            return DASH
        text = format(value, spec)
        return format(0.0, spec) if float(text) == 0 else text  # no "-0.00"

    return fmt


MS = _fmt(".2f")
SIGNED_MS = _fmt("+.2f")
RATIO = _fmt(".3f")
RATE = _fmt(".0f")
COUNT = _fmt(".0f")
ONE = _fmt(".1f")
CPU_S = _fmt(".3f")


def _col(key: str, fmt: Callable[[object], str]) -> Cell:
    return lambda row: fmt(row.get(key))


def _stalled(row: Row) -> str:
    if row.get("stalled") is None:
        return DASH
    return f"{COUNT(row.get('stalled'))}/{COUNT(row.get('total_streams', row.get('streams')))}"


def _loaded(row: Row) -> str:
    rss = ONE(row.get("rss_loaded_mb"))
    streams = row.get("streams")
    return rss if rss == DASH or streams is None else f"{rss} (N={COUNT(streams)})"


def _cpu(part: str) -> Cell:
    return lambda row: ONE((row.get("cpu_pct") or {}).get(part))


def _met(row: Row) -> str:
    met = row.get("met")
    return DASH if met is None else ("✅" if met else "❌")


# ---------------------------------------------------------------- results access


def _label(results: Results, config: str) -> str:
    return str((results.get("labels") or {}).get(config, config))


def _section(results: Results, key: str) -> Mapping[str, Any]:
    section = results.get(key)
    return section if isinstance(section, Mapping) else {}


def _order(results: Results, section: Mapping[str, Any]) -> list[str]:
    """The configs present in `section`: display order first, then any others."""
    listed = [c for c in results.get("configs") or [] if c in section]
    return listed + [c for c in section if c not in listed]


def _sizes(results: Results) -> list[int]:
    """Every stream count N measured in the concurrency section, ascending."""
    keys = {k for rows in _section(results, "concurrency").values() for k in rows}
    return sorted(int(k) for k in keys if str(k).isdigit())


def _entry(section: Mapping[str, Any], config: str) -> Row:
    """One config's dict in `section`; empty if missing or malformed."""
    row = section.get(config)
    return row if isinstance(row, Mapping) else {}


def _round(results: Results, config: str, n: int) -> Row | None:
    row = _entry(_section(results, "concurrency"), config).get(str(n))
    return row if isinstance(row, Mapping) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# ---------------------------------------------------------------- markdown


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> list[str]:
    """A GitHub table; the first `left` columns are left-aligned, the rest right-aligned."""
    body = [_row(r) for r in rows]
    if not body:
        return ["_Not measured in this run._", ""]
    align = [":--" if i < left else "--:" for i in range(len(headers))]
    return [_row(headers), _row(align), *body, ""]


def _config_table(results: Results, key: str, columns: Sequence[tuple[str, Cell]]) -> list[str]:
    """One row per config of section `key`, one column per (header, cell) in `columns`."""
    section = _section(results, key)
    rows = [
        [_label(results, c), *(cell(section[c]) for _, cell in columns)]
        for c in _order(results, section)
        if isinstance(section[c], Mapping)
    ]
    return _table(["config", *(h for h, _ in columns)], rows)


def _by_size_table(results: Results, columns: Sequence[tuple[str, Cell]]) -> list[str]:
    """One row per (N, config) of the concurrency section, grouped by N."""
    configs = _order(results, _section(results, "concurrency"))
    rows = [
        [str(n), _label(results, c), *(cell(row) for _, cell in columns)]
        for n in _sizes(results)
        for c in configs
        if (row := _round(results, c, n)) is not None
    ]
    return _table(["N", "config", *(h for h, _ in columns)], rows, left=2)


def _header(results: Results) -> list[str]:
    meta = _section(results, "meta")
    lines = ["## Results", ""]
    if meta.get("quick"):
        lines += [
            "> **⚠️ Quick smoke run.** Short rounds and few stream counts: the figures below only",
            "> show that the harness works; they are not meaningful measurements.",
            "",
        ]
    runtime = _number(meta.get("runtime_s"))
    fields = [
        ("Date", str(meta.get("date") or DASH)),
        ("Command", f"`{meta['command']}`" if meta.get("command") else DASH),
        ("Machine", str(meta.get("machine") or DASH)),
        ("Commit", f"`{meta['commit']}`" if meta.get("commit") else DASH),
        ("Pinning", str(meta.get("pinning") or DASH)),
        ("Gateway workers", str(meta.get("workers") or DASH)),
        ("LiteLLM", str(meta.get("litellm") or "not installed")),
        ("Runtime", DASH if runtime is None else f"{runtime:.0f} s ({runtime / 60:.1f} min)"),
    ]
    lines += [f"- **{name}:** {value}" for name, value in fields]
    notes = [str(n) for n in meta.get("notes") or []]
    if notes:
        lines += ["", "Notes:", "", *(f"- {n}" for n in notes)]
    lines += [
        "",
        "Times in ms, rates per second. “Added” is the proxy's figure minus the direct "
        "(no proxy) one; “× direct” is the ratio to direct.",
        "",
    ]
    return lines


def _targets(results: Results) -> list[str]:
    rows = [
        [
            *(DASH if t.get(k) is None else str(t[k]) for k in ("name", "target", "measured")),
            _met(t),
        ]
        for t in results.get("targets") or []
        if isinstance(t, Mapping)
    ]
    return ["### Targets", "", *_table(["name", "target", "measured", "met"], rows, left=3)]


# The columns of one stream's TTFT and of the seam, for chat and for each protocol's row.
TTFT: tuple[tuple[str, Cell], ...] = (
    ("n", _col("n", COUNT)),
    ("p50", _col("p50", MS)),
    ("p99", _col("p99", MS)),
    ("added p50", _col("added_p50", SIGNED_MS)),
    ("added p99", _col("added_p99", SIGNED_MS)),
    ("errors", _col("errors", COUNT)),
)
SEAM: tuple[tuple[str, Cell], ...] = (
    ("n", _col("n", COUNT)),
    ("seam p50", _col("p50", MS)),
    ("seam p99", _col("p99", MS)),
    ("new leg TTFT p50", _col("leg_ttft_p50", MS)),
    ("p99", _col("leg_ttft_p99", MS)),
    ("seam − leg TTFT p50", _col("excess_p50", SIGNED_MS)),
    ("p99", _col("excess_p99", SIGNED_MS)),
    ("errors", _col("errors", COUNT)),
)


def _ttft(results: Results) -> list[str]:
    return ["### One stream: time to first token", "", *_config_table(results, "ttft", TTFT)]


def _concurrency(results: Results) -> list[str]:
    columns = [
        ("frames/s", _col("frames_per_s", RATE)),
        ("× direct", _col("vs_direct", RATIO)),
        ("gap p50", _col("gap_p50", MS)),
        ("gap p99", _col("gap_p99", MS)),
        ("added gap p99", _col("added_gap_p99", SIGNED_MS)),
        (f"streams with gap > {STALL_MS} ms", _stalled),
        ("errors", _col("errors", COUNT)),
        ("TTFT p50", _col("ttft_p50", MS)),
        ("TTFT p99", _col("ttft_p99", MS)),
        ("CPU s / 1000 chunks", _col("cpu_s_per_1000_chunks", CPU_S)),
    ]
    cpu = [(part, _cpu(part)) for part in ("proxy", "upstream", "client", "redis", "other")]
    return [
        "### Concurrent streams",
        "",
        *_by_size_table(results, columns),
        "### CPU use during the rounds (% of one core)",
        "",
        *_by_size_table(results, cpu),
    ]


def _nonstream(results: Results) -> list[str]:
    columns = [
        ("concurrency", _col("concurrency", COUNT)),
        ("requests", _col("requests", COUNT)),
        ("req/s", _col("req_per_s", RATE)),
        ("× direct", _col("vs_direct", RATIO)),
        ("p50", _col("p50", MS)),
        ("p99", _col("p99", MS)),
        ("errors", _col("errors", COUNT)),
    ]
    return ["### Non-streaming requests", "", *_config_table(results, "nonstream", columns)]


def _seam(results: Results) -> list[str]:
    return [
        "### Seam latency",
        "",
        "From an upstream fault to the first spliced delta, next to the upstream's own TTFT "
        "for the continuation request measured directly.",
        "",
        *_config_table(results, "seam", SEAM),
    ]


def _resources(results: Results) -> list[str]:
    columns = [
        ("CPU s / 1000 chunks", _col("cpu_s_per_1000_chunks", CPU_S)),
        ("RSS idle MB", _col("rss_idle_mb", ONE)),
        ("RSS loaded MB at N streams", _loaded),
        ("KB per stream", _col("rss_per_stream_kb", ONE)),
    ]
    return ["### Resources", "", *_config_table(results, "resources", columns)]


def _stall_free(results: Results) -> list[str]:
    section = _section(results, "stall_free")
    rows = [[_label(results, c), COUNT(section[c])] for c in _order(results, section)]
    return [
        "### Stall-free concurrency",
        "",
        f"The largest N with no stream gap > {STALL_MS} ms and no errors (0 if none).",
        "",
        *_table(["config", "N"], rows),
    ]


def _responses(results: Results) -> list[str]:
    """The Responses API row: its own TTFT, CPU per delta next to chat's, and seam."""
    streams = COUNT(_section(results, "responses").get("streams"))
    intro = (
        f"`POST /v1/responses` against the same upstream (the same text deltas and pacing, as "
        f"Responses events). CPU per delta from chat and Responses rounds of {streams} streams "
        "run alternately; TTFT and seam as the chat workloads, each against direct Responses "
        "(LiteLLM is not measured here)."
    )
    return _protocol_row(results, "responses", "Responses", intro)


def _messages(results: Results) -> list[str]:
    """The Anthropic Messages API row, against the chaos upstream."""
    streams = COUNT(_section(results, "messages").get("streams"))
    intro = (
        "`POST /v1/messages` (an `anthropic` upstream). Every figure of this row, chat's too, "
        "is against the chaos upstream, as the bench upstream does not speak Messages: CPU per "
        f"delta from chat and Messages rounds of {streams} streams asking it for the same "
        "answer (64 text deltas, every event 20 ms apart), run alternately; one stream's TTFT "
        "and the seam as the chat workloads, against the chaos upstream directly (LiteLLM is "
        "not measured here)."
    )
    return _protocol_row(results, "messages", "Messages", intro, " (chaos upstream)")


def _gemini(results: Results) -> list[str]:
    """The Gemini API row, against the chaos upstream, as the Messages row."""
    streams = COUNT(_section(results, "gemini").get("streams"))
    intro = (
        "`POST /v1beta/models/{model}:streamGenerateContent?alt=sse` (a `gemini` upstream). "
        "Every figure of this row, chat's too, is against the chaos upstream, as the bench "
        "upstream does not speak Gemini: CPU per delta from chat and Gemini rounds of "
        f"{streams} streams asking it for the same answer (64 text deltas, every event 20 ms "
        "apart), run alternately; one stream's TTFT and the seam as the chat workloads, "
        "against the chaos upstream directly (LiteLLM is not measured here)."
    )
    return _protocol_row(results, "gemini", "Gemini", intro, " (chaos upstream)")


def _protocol_row(
    results: Results, key: str, name: str, intro: str, chat_where: str = ""
) -> list[str]:
    """A protocol's row (section ``key``): its own TTFT, CPU per delta next to chat's, seam."""
    section = _section(results, key)
    if not section:
        return []
    view = {"configs": results.get("configs"), "labels": results.get("labels"), **section}
    streams = COUNT(section.get("streams"))
    summary = [
        (f"chat{chat_where} CPU ms / delta", _col("chat_cpu_ms_per_delta", CPU_S)),
        (f"{name} CPU ms / delta", _col(f"{key}_cpu_ms_per_delta", CPU_S)),
        (f"{name} ÷ chat", _col("cpu_ratio", RATIO)),
        ("chat × direct", _col("chat_frames_vs_direct", RATIO)),
        (f"{name} × direct", _col(f"{key}_frames_vs_direct", RATIO)),
        ("added TTFT p50: chat", _col("chat_ttft_added_p50", SIGNED_MS)),
        (name, _col("ttft_added_p50", SIGNED_MS)),
        ("seam − leg TTFT p50: chat", _col("chat_seam_excess_p50", SIGNED_MS)),
        (name, _col("seam_excess_p50", SIGNED_MS)),
    ]
    rounds = _entry(section, "concurrency")
    columns = [
        ("frames/s", _col("frames_per_s", RATE)),
        ("× direct", _col("vs_direct", RATIO)),
        ("gap p99", _col("gap_p99", MS)),
        ("added gap p99", _col("added_gap_p99", SIGNED_MS)),
        (f"streams with gap > {STALL_MS} ms", _stalled),
        ("errors", _col("errors", COUNT)),
        ("TTFT p50", _col("ttft_p50", MS)),
        ("CPU s / 1000 chunks", _col("cpu_s_per_1000_chunks", CPU_S)),
        ("proxy CPU %", _cpu("proxy")),
    ]
    rows = [
        [protocol, _label(results, c), *(cell(row) for _, cell in columns)]
        for protocol in ("chat", key)
        for c in _order(results, _entry(rounds, protocol))
        if (row := _entry(_entry(rounds, protocol), c))
    ]
    title = "Anthropic Messages API" if key == "messages" else f"{name} API"
    return [
        f"### {title}, side by side with chat",
        "",
        intro,
        "",
        *_config_table(view, "summary", summary),
        f"#### {streams} concurrent streams, chat and {name} rounds alternating",
        "",
        *_table(["protocol", "config", *(h for h, _ in columns)], rows, left=2),
        f"#### {name}: one stream, time to first token",
        "",
        *_config_table(view, "ttft", TTFT),
        f"#### {name}: seam latency",
        "",
        *_config_table(view, "seam", SEAM),
    ]


def _durability(results: Results) -> list[str]:
    """Redis checkpoints with durability sync (group commit) next to async."""
    levels = _section(results, "concurrency")
    sync, unsync = levels.get("redis") or {}, levels.get("redis-async") or {}
    if not sync or not unsync:
        return []
    rows = []
    for n in sorted(set(sync) & set(unsync), key=int):
        for name, row in (("sync", sync[n]), ("async", unsync[n])):
            other = unsync[n] if name == "sync" else sync[n]
            frames, theirs = row.get("frames_per_s"), other.get("frames_per_s")
            cpu = row.get("cpu_pct") or {}
            rows.append(
                [
                    n,
                    name,
                    RATE(frames),
                    RATIO(frames / theirs) if name == "sync" and frames and theirs else DASH,
                    SIGNED_MS(row.get("added_lateness_p50")),
                    SIGNED_MS(row.get("added_lateness_p99")),
                    SIGNED_MS(row.get("added_gap_p99")),
                    CPU_S(row.get("cpu_s_per_1000_chunks")),
                    RATE(row.get("redis_ops_per_s")),
                    _number_text(cpu.get("redis")),
                ]
            )
    header = [
        "N",
        "durability",
        "frames/s",
        "× async",
        "added latency per event p50",
        "p99",
        "added gap p99",
        "CPU ms / delta",
        "Redis ops/s",
        "Redis CPU %",
    ]
    return [
        "### Durability: sync (group commit) vs async, Redis checkpoints",
        "",
        "Latency per event: how late each delta reached the client against the",
        "upstream's pacing, minus the same for a direct connection.",
        "",
        *_table(header, rows, left=2),
    ]


def _number_text(value: object) -> str:
    return DASH if not isinstance(value, int | float) else f"{value:.0f}"


def markdown(results: Results) -> str:
    """The results as a markdown document (header, then one section per workload)."""
    sections = (
        _header,
        _targets,
        _ttft,
        _concurrency,
        _durability,
        _nonstream,
        _seam,
        _resources,
        _stall_free,
        _responses,
        _messages,
        _gemini,
    )
    lines = [line for section in sections for line in section(results)]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- chart


def _colors(results: Results) -> dict[str, str]:
    """A fixed color per config, the same in every subplot; direct is black."""
    configs = list(results.get("configs") or [])
    for key in ("ttft", "concurrency", "nonstream", "seam", "resources"):
        configs += [c for c in _section(results, key) if c not in configs]
    others = [c for c in configs if c != BASELINE]
    colors = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(others)}
    return {BASELINE: "black", **colors}


def _series(results: Results, config: str, key: str) -> tuple[list[int], list[float]]:
    """(N, value) pairs of one concurrency metric for one config, skipping missing values."""
    points = [
        (n, v)
        for n in _sizes(results)
        if (row := _round(results, config, n)) is not None
        and (v := _number(row.get(key))) is not None
    ]
    return [n for n, _ in points], [v for _, v in points]


def _scale_y(ax: Axes, values: Sequence[float], bars: bool = False, decades: float = 2) -> None:
    """Log y axis when `values` span more than `decades` above 1 (symlog for bars or values ≤ 0).

    Values under 1 count as 1: a 0.03 ms next to a 5 ms target is no reason for a log axis.
    """
    sizes = [max(abs(v), LINTHRESH) for v in values]
    if not sizes or max(sizes) / min(sizes) <= 10**decades:
        return
    low = min(values)
    if bars or low <= 0:
        ax.set_yscale("symlog", linthresh=LINTHRESH)  # linear within ±1, log beyond
        if low > -LINTHRESH:  # don't spend a decade of height on a small negative value
            ax.set_ylim(bottom=min(low, 0) * 1.5 - 0.05)
    else:
        ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))


def _size_axis(ax: Axes, sizes: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(sizes), [str(n) for n in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("concurrent streams (N)")


def _config_axis(ax: Axes, results: Results, configs: Sequence[str]) -> None:
    labels = [textwrap.fill(_label(results, c), 14, break_on_hyphens=False) for c in configs]
    ax.set_xticks(range(len(configs)), labels, fontsize=8)


def _finish(ax: Axes, title: str, ylabel: str, has_data: bool) -> None:
    ax.set_title(title, fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    if not has_data:
        ax.set_ylabel("")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        return
    ax.set_ylabel(ylabel)
    if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _plot_throughput(ax: Axes, results: Results, colors: Mapping[str, str]) -> None:
    values: list[float] = []
    for config in _order(results, _section(results, "concurrency")):
        xs, ys = _series(results, config, "frames_per_s")
        if xs:
            ax.plot(xs, ys, marker="o", color=colors[config], label=_label(results, config))
            values += ys
    sizes = _sizes(results)
    if values:
        ideal = [n * PACE_CHUNKS / (PACE_INTERVALS * PACE_S) for n in sizes]
        ax.plot(sizes, ideal, ls="--", color="grey", label="pace-limited ideal")
        _size_axis(ax, sizes)
        _scale_y(ax, values + ideal)
    _finish(ax, "Delivered frames/s vs concurrent streams", "frames/s", bool(values))


def _plot_gap(ax: Axes, results: Results, colors: Mapping[str, str]) -> None:
    values: list[float] = []
    for config in _order(results, _section(results, "concurrency")):
        xs, ys = _series(results, config, "added_gap_p99")
        if xs and config != BASELINE:
            ax.plot(xs, ys, marker="o", color=colors[config], label=_label(results, config))
            values += ys
    if values:
        ax.axhline(GAP_TARGET_MS, ls="--", color="grey", label=f"target {GAP_TARGET_MS:g} ms")
        _size_axis(ax, _sizes(results))
        _scale_y(ax, [*values, GAP_TARGET_MS])
    _finish(ax, "Added inter-chunk gap p99 vs direct", "added gap p99 (ms)", bool(values))


def _ttft_bars(ax: Axes, results: Results, colors: Mapping[str, str], pct: str) -> list[float]:
    """One bar per proxy config for added TTFT `pct`, labelled with its value; the values."""
    section = _section(results, "ttft")
    width, first = 0.38, pct == "p50"
    offset = -width / 2 if first else width / 2
    points = [
        (i, v, colors[c])
        for i, c in enumerate(c for c in _order(results, section) if c != BASELINE)
        if (v := _number(_entry(section, c).get(f"added_{pct}"))) is not None
    ]
    if points:
        bars = ax.bar(
            [i + offset for i, _, _ in points],
            [v for _, v, _ in points],
            width,
            color=[color for _, _, color in points],
            alpha=1.0 if first else 0.55,
            hatch=None if first else "//",
            edgecolor="black",
            linewidth=0.5,
        )
        ax.bar_label(bars, fmt="%+.2f", fontsize=7, padding=2)
    return [v for _, v, _ in points]


def _plot_ttft(ax: Axes, results: Results, colors: Mapping[str, str]) -> None:
    values = [v for pct in TTFT_TARGETS_MS for v in _ttft_bars(ax, results, colors, pct)]
    if values:
        for (pct, target), ls in zip(TTFT_TARGETS_MS.items(), ("--", ":"), strict=True):
            ax.axhline(target, ls=ls, color="grey", label=f"{pct} target {target:g} ms")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.legend(
            handles=[
                Patch(facecolor="lightgrey", edgecolor="black", label="p50"),
                Patch(facecolor="lightgrey", edgecolor="black", hatch="//", label="p99"),
                *ax.get_legend_handles_labels()[0],
            ],
            fontsize=8,
        )
        configs = [c for c in _order(results, _section(results, "ttft")) if c != BASELINE]
        _config_axis(ax, results, configs)
        _scale_y(ax, [*values, *TTFT_TARGETS_MS.values()], bars=True, decades=1)
    _finish(ax, "Added TTFT at one stream vs direct", "added TTFT (ms)", bool(values))


def _plot_nonstream(ax: Axes, results: Results, colors: Mapping[str, str]) -> None:
    section = _section(results, "nonstream")
    rates = {c: _number(_entry(section, c).get("req_per_s")) for c in _order(results, section)}
    configs = [c for c, rate in rates.items() if rate is not None]
    for i, config in enumerate(configs):
        bars = ax.bar(i, rates[config] or 0.0, 0.6, color=colors[config])
        ratio = RATIO(_entry(section, config).get("vs_direct"))
        ax.bar_label(bars, ["" if ratio == DASH else f"×{ratio}"], fontsize=8, padding=2)
    if configs:
        ax.margins(y=0.12)
        _config_axis(ax, results, configs)
        concurrency = {COUNT(_entry(section, c).get("concurrency")) for c in configs}
        if len(concurrency) == 1 and DASH not in concurrency:
            ax.set_xlabel(f"{concurrency.pop()} concurrent non-streaming requests")
    _finish(ax, "Non-streaming throughput (× direct on bars)", "requests/s", bool(configs))


def _machine_short(machine: str) -> str:
    short = ", ".join(part.strip() for part in machine.split(",")[:2])
    return short if len(short) <= 60 else short[:59] + "…"


def chart(results: Results, path: Path) -> None:
    """Draw the 2x2 summary chart to `path` (PNG)."""
    meta = _section(results, "meta")
    fig = Figure(figsize=(12, 8), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    colors = _colors(results)
    plots = (_plot_throughput, _plot_gap, _plot_ttft, _plot_nonstream)
    for i, plot in enumerate(plots, start=1):
        plot(fig.add_subplot(2, 2, i), results, colors)
    title = f"resumable-gateway benchmarks — {meta.get('date') or DASH}"
    if meta.get("machine"):
        title += f" — {_machine_short(str(meta['machine']))}"
    if meta.get("quick"):
        title += " (quick smoke run)"
    fig.suptitle(title, fontsize=13)
    fig.savefig(path, dpi=110)


def write(results: Results, outdir: Path) -> list[Path]:
    """Write results.json, results.md and chart.png into `outdir`; return their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (outdir / n for n in ("results.json", "results.md", "chart.png"))
    json_path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    md_path.write_text(markdown(results), encoding="utf-8")
    chart(results, png_path)
    return [json_path, md_path, png_path]

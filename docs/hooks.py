"""MkDocs hooks: the pages generated from the code at every build (gateway.reference),
and BENCHMARKS.md from the repository's root, so the site cannot drift from either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from gateway.reference import config_reference, metrics_reference

ROOT = Path(__file__).resolve().parent.parent


def on_files(files: Files, config: Any) -> Files:
    pages = {
        "reference/configuration.md": config_reference(),
        "reference/metrics.md": metrics_reference(),
        "benchmarks.md": (ROOT / "BENCHMARKS.md").read_text(),
    }
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    chart = "bench/results/chart.png"  # BENCHMARKS.md shows it
    files.append(File.generated(config, chart, abs_src_path=str(ROOT / chart)))
    return files

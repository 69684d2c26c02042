"""MkDocs hooks: the pages generated from the code at every build (gateway.reference),
BENCHMARKS.md from the repository's root, so the site cannot drift from either; and
mermaid, served with the site.

Material draws the ```mermaid blocks in the browser with mermaid, which it fetches from a
CDN (unpkg.com/mermaid@11) unless a page has loaded one already: behind a firewall, or
offline, every diagram would show as its source. So the site serves its own copy,
``assets/javascripts/mermaid.min.js`` (``extra_javascript`` in mkdocs.yml), taken at build
time from the mermaid that ``scripts/install`` puts in ``scripts/mermaid-check/`` (the
one the diagrams are parsed with, pinned by its package-lock.json), not committed: one
version, one lock file, no 3.5 MB blob in the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from gateway.reference import config_reference, metrics_reference

ROOT = Path(__file__).resolve().parent.parent
MERMAID = (
    ROOT / "scripts" / "mermaid-check" / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
)
MERMAID_URL = "assets/javascripts/mermaid.min.js"  # as mkdocs.yml's extra_javascript says


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
    if not MERMAID.is_file():
        raise PluginError(
            f"{MERMAID.relative_to(ROOT)} is missing: the site serves its own mermaid, "
            "which scripts/install installs (npm ci in scripts/mermaid-check)"
        )
    files.append(File.generated(config, MERMAID_URL, abs_src_path=str(MERMAID)))
    return files

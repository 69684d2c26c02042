"""Every Mermaid diagram in docs/ parses, by mermaid's own parser, and the site draws them
with that mermaid, served with it.

The site draws ```mermaid blocks in the browser, so a syntax error would reach a reader as
an error box while ``mkdocs build --strict`` passes. ``scripts/mermaid-check/check.mjs``
parses each block with mermaid under jsdom, no browser needed; ``scripts/install``
installs it. The built site serves that same file (docs/hooks.py), so a diagram draws
offline and behind a firewall, where Material's default, mermaid from a CDN, shows its
source. Needs node: this fails rather than skips without it, so the check cannot go quiet
on a machine that lacks it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHECK = ROOT / "scripts" / "mermaid-check"
FENCE = re.compile(r"^```mermaid\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def diagrams() -> list[tuple[str, str]]:
    """(where, text) for every ```mermaid block in the docs."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match[1]))
    return found


def parse(blocks: list[tuple[str, str]]) -> list[dict[str, str | None]]:
    node = shutil.which("node")
    assert node is not None, "node is needed to parse the docs' Mermaid diagrams"
    assert (CHECK / "node_modules" / "mermaid").is_dir(), (
        f"{CHECK.relative_to(ROOT)}/node_modules is missing: run scripts/install"
    )
    done = subprocess.run(
        [node, str(CHECK / "check.mjs")],
        input=orjson.dumps([{"where": w, "text": t} for w, t in blocks]),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    results: list[dict[str, str | None]] = orjson.loads(done.stdout)
    return results


def test_the_docs_draw_the_diagrams_issue_41_asks_for() -> None:
    where = {w.split(":")[0] for w, _ in diagrams()}
    assert {"docs/recovery.md", "docs/durable-runs.md", "docs/development.md"} <= where


def test_every_mermaid_diagram_parses() -> None:
    blocks = diagrams()
    results = parse(blocks)
    assert [r["where"] for r in results] == [w for w, _ in blocks]
    errors = [f"{r['where']}: {r['error']}" for r in results if r["error"] is not None]
    assert not errors, "\n\n".join(errors)


@pytest.mark.parametrize(
    "broken",
    [
        "sequenceDiagram\n    A->>: no one to send to",
        "flowchart TD\n    a --> ",
        "flowchart TD\n    a{unclosed --> b",
    ],
)
def test_the_check_catches_a_syntax_error(broken: str) -> None:
    (result,) = parse([("broken", broken)])
    assert result["error"], f"parsed without an error: {broken!r}"


def build_site(site: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_the_site_serves_its_own_mermaid_and_no_page_loads_from_a_cdn(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    build_site(site)
    served = site / "assets" / "javascripts" / "mermaid.min.js"
    parsed_with = CHECK / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
    assert served.read_bytes() == parsed_with.read_bytes()  # the one the diagrams parse with
    pages = {page: page.read_text(encoding="utf-8") for page in site.rglob("*.html")}
    drawn = [page for page, html in pages.items() if 'class="mermaid"' in html]
    assert len(drawn) >= 3
    for page, html in pages.items():
        assert not re.search(r"unpkg\.com|jsdelivr\.net|cdnjs|fonts\.googleapis\.com", html), page
    for page in drawn:
        scripts = re.findall(r'<script src="([^"]+)"', pages[page])
        local = [s for s in scripts if s.endswith("assets/javascripts/mermaid.min.js")]
        assert local, f"{page} does not load the site's mermaid: {scripts}"
        assert (page.parent / local[0]).resolve() == served.resolve()
    # Material fetches mermaid from its CDN only when none is loaded: the condition the
    # site's own copy relies on, in the theme's bundle (a new theme version may change it).
    (bundle,) = (site / "assets" / "javascripts").glob("bundle.*.min.js")
    assert 'typeof mermaid=="undefined"' in bundle.read_text(encoding="utf-8")

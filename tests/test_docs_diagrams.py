"""Every Mermaid diagram in docs/ parses, by mermaid's own parser.

The site draws ```mermaid blocks in the browser (mkdocs-material loads mermaid 11), so a
syntax error would reach a reader as an error box while ``mkdocs build --strict`` passes.
``scripts/mermaid-check/check.mjs`` parses each block with the same major version of
mermaid under jsdom, no browser needed; ``scripts/install`` installs it. Needs node: this
fails rather than skips without it, so the check cannot go quiet on a machine that lacks it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
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

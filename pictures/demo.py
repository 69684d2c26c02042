"""Three scenes of ``resumable-gateway demo``, run and captured as a colour terminal shows them."""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

from gateway.demo import SCENARIOS, run_demo
from pictures.terminal import terminal_svg

COLUMNS = 96  # the report wraps at one column less
COMMAND = "resumable-gateway demo"
# A reset mid-text; an error event whose continuation quotes back the words it was asked
# to (trimmed at the seam); a reset inside a tool call's arguments.
SHOWN = (SCENARIOS[0], SCENARIOS[2], SCENARIOS[4])
_SCENE = re.compile(r"^\033\[1m\d+/\d+ ", re.MULTILINE)
_SUMMARY = re.compile(r"^\033\[32;1m", re.MULTILINE)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def _environment() -> Iterator[None]:
    """A terminal COLUMNS wide, with colour."""
    saved = {name: os.environ.get(name) for name in ("COLUMNS", "NO_COLOR")}
    os.environ["COLUMNS"] = str(COLUMNS)
    os.environ.pop("NO_COLOR", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def capture() -> str:
    """The demo's output for SHOWN, paced as the command paces it, up to its summary."""
    out = _Terminal()
    with _environment():
        status = run_demo(out=out, scenarios=SHOWN)
    text = out.getvalue()
    if status != 0:
        raise SystemExit(f"the demo failed; its output:\n{text}")
    return text[: text.index("\n\nTry it with your own client")]  # not the closing hint


def scenes(output: str) -> list[str]:
    """Each scene's lines (from its numbered title to the line before the next)."""
    starts = [match.start() for match in _SCENE.finditer(output)]
    summary = _SUMMARY.search(output)
    ends = [*starts[1:], summary.start() if summary else len(output)]
    return [output[start:end].rstrip("\n") for start, end in zip(starts, ends, strict=True)]


def write(folder: Path) -> list[Path]:
    output = capture()
    first = scenes(output)[0]
    pictures = {
        "demo.svg": terminal_svg(output, f"$ {COMMAND}", COLUMNS),
        "demo-reset.svg": terminal_svg(first, f"$ {COMMAND}   (scene 1)", COLUMNS),
    }
    written = []
    for name, svg in pictures.items():
        (folder / name).write_text(svg, encoding="utf-8")
        written.append(folder / name)
    return written

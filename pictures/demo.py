"""Scenes of ``resumable-gateway demo``, run and captured as a colour terminal shows them:
its first, a real model's answer surviving a killed server (the docs' front page), and
three of the chaos upstream's (Getting started)."""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

from gateway.demo import SCENARIOS, Scenario, run_demo
from pictures.terminal import terminal_svg

COLUMNS = 96  # the report wraps at one column less
COMMAND = "resumable-gateway demo"
# A reset mid-text; an error event whose continuation quotes back the words it was asked
# to (trimmed at the seam); a reset inside a tool call's arguments.
SHOWN = (SCENARIOS[0], SCENARIOS[2], SCENARIOS[4])
_SCENE = re.compile(r"^\033\[1m\d+/\d+ ", re.MULTILINE)
_SUMMARY = re.compile(r"^\033\[32;1m", re.MULTILINE)
_BETWEEN = re.compile(r"^The chaos upstream: ", re.MULTILINE)  # gateway.demo.stage


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


def capture(scenarios: tuple[Scenario, ...], real_model: bool) -> str:
    """The demo's output for the real-model scene (``real_model``) and ``scenarios``, paced
    as the command paces them, up to its summary."""
    out = _Terminal()
    with _environment():
        status = run_demo(out=out, scenarios=scenarios, real_model=real_model)
    text = out.getvalue()
    if status != 0:
        raise SystemExit(f"the demo failed; its output:\n{text}")
    return text[: text.index("\n\nTry it with your own client")]  # not the closing hint


def scenes(output: str) -> list[str]:
    """Each scene's lines (from its numbered title to the line before the next, or before
    the chaos upstream's introduction after the real-model scene, or the summary)."""
    starts = [match.start() for match in _SCENE.finditer(output)]
    bounds = [*starts[1:], *(match.start() for match in _BETWEEN.finditer(output))]
    summary = _SUMMARY.search(output)
    bounds.append(summary.start() if summary else len(output))
    ends = [min(bound for bound in bounds if bound > start) for start in starts]
    return [output[start:end].rstrip("\n") for start, end in zip(starts, ends, strict=True)]


def write(folder: Path) -> list[Path]:
    chaos = capture(SHOWN, real_model=False)
    real = scenes(capture(SCENARIOS, real_model=True))[0]  # numbered as the command does
    pictures = {
        "demo.svg": terminal_svg(chaos, f"$ {COMMAND}", COLUMNS),
        "demo-real-model.svg": terminal_svg(real, f"$ {COMMAND}   (scene 1)", COLUMNS),
    }
    written = []
    for name, svg in pictures.items():
        (folder / name).write_text(svg, encoding="utf-8")
        written.append(folder / name)
    return written

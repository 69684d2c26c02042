"""Terminal output (text with ANSI colour codes) drawn as an SVG terminal window."""

from __future__ import annotations

import re
from dataclasses import dataclass
from xml.sax.saxutils import escape

from gateway.demo.report import columns  # as the demo counts them: wide characters take two

_SGR = re.compile(r"\033\[([0-9;]*)m")
_SEGMENT = re.compile(r"\S+(?: \S+)*")  # words with single spaces between them

# What the demo's report uses (gateway.demo.report.Style), on a dark background.
BACKGROUND = "#1e1f29"
FOREGROUND = "#d6d7dd"
COLOURS = {"31": "#ff6e6e", "32": "#5af78e", "33": "#f4f99d", "36": "#6ed5e6"}
DIM = "#8a8c99"

FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace"
FONT_SIZE = 13
CELL = FONT_SIZE * 0.6  # a monospace character's advance, in px
LINE = 18
PAD = 16
TITLE_BAR = 30


@dataclass(frozen=True)
class Run:
    """Characters of one line in one style, from a column."""

    column: int
    text: str
    bold: bool
    dim: bool
    colour: str | None


@dataclass(frozen=True)
class Style:
    bold: bool = False
    dim: bool = False
    colour: str | None = None

    def after(self, codes: str) -> Style:
        """The style once an SGR sequence with ``codes`` (e.g. "32;1") is applied."""
        bold, dim, colour = self.bold, self.dim, self.colour
        for code in codes.split(";") if codes else ["0"]:
            if code in ("0", ""):
                bold, dim, colour = False, False, None
            elif code == "1":
                bold = True
            elif code == "2":
                dim = True
            elif code in COLOURS:
                colour = COLOURS[code]
        return Style(bold, dim, colour)


def styled_runs(line: str, style: Style | None = None) -> tuple[list[Run], Style]:
    """One line's text split where its ANSI style changes, starting in ``style`` (a
    terminal keeps the style across a newline); and the style at its end."""
    runs: list[Run] = []
    style = style or Style()
    column = position = 0
    for match in [*_SGR.finditer(line), None]:
        end = match.start() if match else len(line)
        if text := line[position:end]:
            runs.append(Run(column, text, style.bold, style.dim, style.colour))
            column += columns(text)
        if match is None:
            break
        position = match.end()
        style = style.after(match[1])
    return runs, style


def segments(run: Run) -> list[tuple[int, str]]:
    """A run's words, split where two or more spaces come and stripped of the spaces at
    their ends, each with its column: what a ``<text>`` draws the same in every browser.

    SVG text collapses runs of white space and drops it at the ends (Chromium ignores
    ``xml:space``; ``white-space: pre`` is not everywhere either), and ``textLength``
    stretched over spaces that are not drawn spreads the letters that are (``m o d e l``).
    Positioned by column, a segment needs no space drawn but its single inner ones."""
    return [
        (run.column + columns(run.text[: match.start()]), match[0])
        for match in _SEGMENT.finditer(run.text)
    ]


def terminal_svg(output: str, title: str, width_columns: int) -> str:
    """``output`` (lines with ANSI codes) in a terminal window ``width_columns`` wide."""
    lines = output.rstrip("\n").split("\n")
    width = round(2 * PAD + width_columns * CELL)
    height = TITLE_BAR + 2 * PAD + len(lines) * LINE
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" rx="8" fill="{BACKGROUND}"/>',
        f'<rect width="{width}" height="{TITLE_BAR}" rx="8" fill="#2b2d3a"/>',
        f'<rect y="{TITLE_BAR - 8}" width="{width}" height="8" fill="#2b2d3a"/>',
    ]
    for index, colour in enumerate(("#ff5f57", "#febc2e", "#28c840")):
        parts.append(f'<circle cx="{18 + 20 * index}" cy="15" r="6" fill="{colour}"/>')
    parts.append(
        f'<text x="{width / 2}" y="19" fill="{DIM}" font-family="{FONT}" font-size="12" '
        f'text-anchor="middle">{escape(title)}</text>'
    )
    parts.append(f'<g font-family="{FONT}" font-size="{FONT_SIZE}" fill="{FOREGROUND}">')
    style = Style()
    for number, line in enumerate(lines):
        y = TITLE_BAR + PAD + (number + 1) * LINE - 5
        runs, style = styled_runs(line, style)
        for run in runs:
            for column, text in segments(run):
                attributes = [f'x="{PAD + column * CELL:.1f}"', f'y="{y}"']
                if run.colour or run.dim:
                    attributes.append(f'fill="{run.colour or DIM}"')
                if run.bold:
                    attributes.append('font-weight="bold"')
                # textLength keeps a segment on its columns whatever the font's advance.
                attributes.append(f'textLength="{columns(text) * CELL:.1f}"')
                parts.append(f"<text {' '.join(attributes)}>{escape(text)}</text>")
    parts.append("</g></svg>")
    return "\n".join(parts) + "\n"

"""``python -m pictures [demo|dashboard]``: regenerate the docs' pictures (see __init__)."""

from __future__ import annotations

import argparse
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "docs" / "pictures"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pictures", description=__doc__)
    parser.add_argument("which", nargs="*", choices=["demo", "dashboard"], default=[])
    which = parser.parse_args().which or ["demo", "dashboard"]
    FOLDER.mkdir(parents=True, exist_ok=True)
    written = []
    if "demo" in which:
        from pictures import demo

        written += demo.write(FOLDER)
    if "dashboard" in which:
        from pictures import dashboard

        written += dashboard.write(FOLDER)
    for path in written:
        print(path.relative_to(FOLDER.parent.parent))


if __name__ == "__main__":
    main()

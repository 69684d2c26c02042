"""``python -m gateway.chaos [--host H] [--port P]``: serve the chaos upstream."""

from __future__ import annotations

import argparse

from gateway.chaos.runner import run

parser = argparse.ArgumentParser(prog="python -m gateway.chaos", description=__doc__)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8001)
arguments = parser.parse_args()
run(arguments.host, arguments.port)

"""LiteLLM's proxy as a benchmark peer: install it into its own venv, configure and start it.

LiteLLM (https://github.com/BerriAI/litellm) is the most widely deployed open-source LLM
gateway, so it is the natural peer to compare against on the same OpenAI-compatible upstream.
This module pins one release, installs ``litellm[proxy]`` into a venv of its own (its
dependency tree is large and must not leak into ours) and configures it the way LiteLLM's
docs recommend for production throughput:

* no database (so no Postgres round trips for keys, spend or errors), and
  ``disable_spend_logs`` / ``disable_error_logs`` on top, per
  https://docs.litellm.ai/docs/proxy/prod;
* ``set_verbose: false`` and ``LITELLM_LOG=ERROR`` (prod checklist: no debug logging; the CLI
  hands the same level to uvicorn, so there is no per-request access log line either);
* no callbacks and ``num_retries: 0``, as in the config LiteLLM's own benchmarks run
  (https://docs.litellm.ai/docs/benchmarks); ``request_timeout: 600`` from the prod config;
* one uvicorn worker, on uvloop (the CLI picks it): LiteLLM recommends one uvicorn worker per
  pod, scaled out rather than up (https://docs.litellm.ai/docs/proxy/server_tuning), and the
  harness pins the proxy to one core;
* ``LITELLM_LOCAL_MODEL_COST_MAP=True``: use the cost map bundled in the wheel instead of
  fetching it from GitHub at every start
  (https://docs.litellm.ai/docs/proxy/custom_model_cost_map);
* ``LITELLM_MODE=PRODUCTION``, so it does not load a ``.env`` from its working directory;
* a master key (``MASTER_KEY``): this release refuses to start without one, and the prod
  checklist says to set one. Every request must send ``HEADERS``.

Nothing else is added: uvicorn parses HTTP with h11, as LiteLLM ships (``litellm[proxy]``
does not pull in httptools), and the proxy makes no outbound calls but to the upstream.

Model names must not hold a comma: LiteLLM reads one as a list of models and sends the
request to each ("batch completions", https://docs.litellm.ai/docs/proxy/user_keys), which
is why the benchmark's model names are ``bench-64x20ms`` and not ``chunks=64,pace_ms=20``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

VERSION = "1.106.2"

READY_PATH = "/health/liveliness"

# Not a secret: the proxy only listens on 127.0.0.1 for the length of a benchmark run.
MASTER_KEY = "sk-resumable-gateway-bench-litellm"

# What every client request through the proxy must send.
HEADERS: dict[str, str] = {"Authorization": f"Bearer {MASTER_KEY}"}


ENV: dict[str, str] = {
    # Use the cost map bundled in the wheel; the default fetches it from GitHub at import.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    # Production mode: skip load_dotenv() of the working directory's .env.
    "LITELLM_MODE": "PRODUCTION",
    # Only errors from LiteLLM's loggers; uvicorn gets the same level (no access log).
    "LITELLM_LOG": "ERROR",
    # The proxy refuses to start without a master key; requests must send HEADERS.
    "LITELLM_MASTER_KEY": MASTER_KEY,
}


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _installed_version(venv: Path) -> str | None:
    python = _python(venv)
    if not python.exists():
        return None
    probe = "import importlib.metadata as m, litellm; print(m.version('litellm'))"
    result = subprocess.run(
        [str(python), "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        check=False,
    )
    lines = result.stdout.split()
    return lines[-1] if result.returncode == 0 and lines else None


def ensure(venv: Path) -> Path:
    """Create ``venv`` and install ``litellm[proxy]==VERSION`` into it unless already there.

    Returns the path of the venv's ``litellm`` executable.
    """
    executable = venv / "bin" / "litellm"
    if executable.exists() and _installed_version(venv) == VERSION:
        return executable
    print(
        f"installing litellm[proxy]=={VERSION} into {venv} (about a minute)...",
        file=sys.stderr,
        flush=True,
    )
    if not _python(venv).exists():
        created = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, check=False
        )
        if created.returncode != 0:
            raise SystemExit(f"could not create venv {venv}: {created.stderr.strip()}")
    installed = subprocess.run(
        [
            str(_python(venv)),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"litellm[proxy]=={VERSION}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if installed.returncode != 0:
        tail = "\n".join(installed.stderr.strip().splitlines()[-20:])
        raise SystemExit(f"pip install litellm[proxy]=={VERSION} into {venv} failed:\n{tail}")
    found = _installed_version(venv)
    if found != VERSION or not executable.exists():
        raise SystemExit(
            f"litellm install in {venv} looks broken: version {found!r}, "
            f"expected {VERSION!r}; executable {executable} exists: {executable.exists()}"
        )
    return executable


def config(upstream_base_url: str, models: Iterable[str] = ()) -> str:
    """The proxy's YAML config: models routed to the upstream, tuned for throughput.

    Deployments, all at the OpenAI-compatible upstream ``upstream_base_url`` (e.g.
    ``http://127.0.0.1:PORT/v1``) with a dummy key: one per name in ``models``, an
    exact match as production configs list their models, then ``*`` for any other
    name. Names must not hold a comma: LiteLLM reads ``a,b`` as two models and sends
    the request to each ("batch completions"; no setting turns it off).
    """
    deployments = [*dict.fromkeys(models), "*"]
    # JSON strings are valid YAML scalars, so json.dumps quotes URLs and names safely.
    base = json.dumps(upstream_base_url)
    model_list = "".join(
        f"""\
  - model_name: {json.dumps(name)}
    litellm_params:
      model: {json.dumps("openai/" + name)}
      api_base: {base}
      api_key: "sk-dummy"
"""
        for name in deployments
    )
    return f"""\
model_list:
{model_list}
litellm_settings:
  set_verbose: false
  callbacks: []
  success_callback: []
  failure_callback: []
  num_retries: 0
  request_timeout: 600
  cache: false

router_settings:
  routing_strategy: simple-shuffle
  num_retries: 0

general_settings:
  disable_spend_logs: true
  disable_error_logs: true
  store_model_in_db: false
  background_health_checks: false
"""


def command(executable: Path, config_path: Path, port: int) -> list[str]:
    """argv that starts the proxy on 127.0.0.1:port with that config, one uvicorn worker."""
    return [
        str(executable),
        "--config",
        str(config_path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]

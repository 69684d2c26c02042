"""The configuration and metrics references of the documentation, rendered from the code.

``config_reference()`` walks ``GatewayConfig``: every key with its type, default and
constraints from the pydantic models, and what it means from the comment the model
has on it (the comment lines just above the field, and one at its end).
``metrics_reference()`` lists every metric a ``Metrics`` registers, with its type,
labels and help. The docs site builds both at every build (``docs/hooks.py``), so
neither can drift from the code.
"""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config.schema import GatewayConfig
from gateway.metrics import Metrics

_FIELD = re.compile(r"^\s{4}(\w+)\s*:")


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comment in ``model``'s source: the comment lines right above it,
    then one at the end of its line."""
    lines, _ = inspect.getsourcelines(model)
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match and match.group(1) in model.model_fields:
            said = list(above)
            if "  # " in line:
                said.append(line.split("  # ", 1)[1].strip())
            out[match.group(1)] = " ".join(said)
        above = []
    return out


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (itself, in a list, or optional), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        model = _nested(argument)
        if model is not None:
            return model
    return None


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    text = re.sub(r"pydantic\.types\.|gateway\.config\.|annotated_types\.", "", text)
    return text.replace("NoneType", "None")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "(computed)"
    if field.default is PydanticUndefined:
        return "required"
    if isinstance(field.default, BaseModel):
        return "(see below)"
    return f"`{field.default!r}`" if field.default is not None else "`None`"


def _constraints(field: FieldInfo) -> str:
    return ", ".join(
        f"{name.replace('_', ' ')} {value}"
        for item in field.metadata
        for name in ("gt", "ge", "lt", "le", "min_length", "max_length")
        if (value := getattr(item, name, None)) is not None
    )


def _section(model: type[BaseModel], path: str, out: list[str]) -> None:
    comments = _comments(model)
    doc = (model.__doc__ or "").strip()
    out += [f"## `{path}`", ""]
    if doc and not doc.startswith("Usage docs"):
        out += [doc, ""]
    out += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    nested: list[tuple[type[BaseModel], str]] = []
    for name, field in model.model_fields.items():
        meaning = comments.get(name) or field.description or ""
        limits = _constraints(field)
        if limits:
            meaning = f"{meaning} ({limits})" if meaning else f"({limits})"
        inner = _nested(field.annotation)
        if inner is not None:
            list_of = typing.get_origin(field.annotation) is list
            nested.append((inner, f"{path}.{name}" + ("[]" if list_of else "")))
        cell = meaning.replace("|", "\\|")
        kind = _type(field.annotation).replace("|", "\\|")
        out.append(f"| `{name}` | `{kind}` | {_default(field)} | {cell} |")
    out.append("")
    for inner, inner_path in nested:
        _section(inner, inner_path, out)


def config_reference() -> str:
    out = [
        "# Configuration reference",
        "",
        "Every key of the YAML config, generated from the gateway's pydantic models at "
        "each build of these docs: types, defaults and limits are the code's own. "
        "`${VAR}` and `${VAR:-default}` are replaced from the environment. A worked "
        "example with every key: `config.example.yaml` at the repository's root; "
        "`resumable-gateway check-config FILE` validates a file and prints what it "
        "resolves to.",
        "",
    ]
    _section(GatewayConfig, "config", out)
    return "\n".join(out).replace("## `config.", "## `")


def metrics_reference() -> str:
    metrics = Metrics()
    out = [
        "# Metrics reference",
        "",
        "Every metric `/metrics` exposes (Prometheus text format), generated from the "
        "gateway's registry at each build of these docs. Labels stay low-cardinality: "
        "never a run id, a client's model name, a prompt or a key.",
        "",
        "| metric | type | labels | what it counts |",
        "| --- | --- | --- | --- |",
    ]
    rows = []
    for value in vars(metrics).values():
        name = getattr(value, "_name", None)
        if name is None or not hasattr(value, "_type"):
            continue
        kind = value._type
        shown = f"{name}_total" if kind == "counter" else name
        labels = ", ".join(f"`{label}`" for label in value._labelnames)
        documentation = value._documentation.replace("|", "\\|")
        rows.append(f"| `{shown}` | {kind} | {labels} | {documentation} |")
    return "\n".join(out + sorted(rows)) + "\n"

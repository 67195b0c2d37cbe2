"""Workload names and spec strings: ``resnet50``, ``bert-base:seq=512,batch=4``, ``model.onnx``.

Zoo models register a builder function with the parameters it accepts and their defaults;
:func:`load_workload` parses a spec string, checks its parameters and builds the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marssim.errors import InputError

from .graph import Graph

__all__ = ["ZooEntry", "register", "zoo_entries", "parse_spec", "load_workload", "format_spec"]


@dataclass(frozen=True)
class ZooEntry:
    """A built-in workload: builder, default parameters and a one-line description."""

    name: str
    build: Callable[..., Graph]
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    multi_model: bool = False


_ZOO: dict[str, ZooEntry] = {}


def register(name: str, *, description: str, multi_model: bool = False, **defaults: Any) -> Callable:
    """Decorator registering ``fn(**params) -> Graph`` as zoo workload ``name``."""

    def wrap(fn: Callable[..., Graph]) -> Callable[..., Graph]:
        _ZOO[name] = ZooEntry(name, fn, dict(defaults), description, multi_model)
        return fn

    return wrap


def zoo_entries() -> dict[str, ZooEntry]:
    """All registered zoo workloads by name (imports the zoo on first use)."""
    from . import zoo  # noqa: F401  (registers the models)

    return dict(_ZOO)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"bert-base:seq=512,batch=4"`` into ``("bert-base", {"seq": "512", "batch": "4"})``."""
    name, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise InputError(spec, key.strip() or item, "expected parameters like 'name:batch=8,seq=512'")
            params[key.strip()] = value.strip()
    return name.strip(), params


def format_spec(name: str, params: dict[str, Any]) -> str:
    """Inverse of :func:`parse_spec` (parameters sorted, so equal specs compare equal)."""
    if not params:
        return name
    return name + ":" + ",".join(f"{k}={params[k]}" for k in sorted(params))


def _coerce(spec: str, key: str, raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        if raw.lower() in ("1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise InputError(spec, key, f"expected true or false, got {raw!r}")
    if isinstance(default, int):
        try:
            value = int(raw)
        except ValueError:
            raise InputError(spec, key, f"expected a positive integer, got {raw!r}") from None
        if value <= 0:
            raise InputError(spec, key, f"expected a positive integer, got {raw!r}")
        return value
    return raw


def load_workload(spec: str, *, batch: int | None = None) -> Graph:
    """Build a workload from a zoo spec (``resnet50:batch=8``) or an ONNX file path.

    ``batch`` overrides the spec's batch. Raises InputError for an unknown name or parameter."""
    if spec.endswith(".onnx") or Path(spec).suffix == ".onnx":
        from .onnx_import import load_onnx

        return load_onnx(spec, batch=batch)
    name, raw = parse_spec(spec)
    entries = zoo_entries()
    if name not in entries:
        raise InputError(spec, "", f"unknown workload {name!r}; expected an .onnx file or one of: {', '.join(sorted(entries))}")
    entry = entries[name]
    params = dict(entry.defaults)
    for key, value in raw.items():
        if key not in entry.defaults:
            allowed = ", ".join(sorted(entry.defaults)) or "none"
            raise InputError(spec, key, f"unknown parameter for {name}; expected one of: {allowed}")
        params[key] = _coerce(spec, key, value, entry.defaults[key])
    if batch is not None:
        if "batch" not in params:
            raise InputError(spec, "batch", f"{name} takes no batch parameter")
        params["batch"] = batch
    graph = entry.build(**params)
    changed = {k: v for k, v in params.items() if v != entry.defaults[k]}
    graph.spec = format_spec(name, changed)
    return graph

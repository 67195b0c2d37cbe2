"""Workload names and spec strings: ``resnet50``, ``bert-base:seq=512,batch=4``, ``model.onnx``,
``hf:PATH/config.json:mode=train`` (a Hugging Face configuration, :mod:`.llm.hf`).

Zoo models register a builder function with the parameters it accepts and their defaults;
:func:`load_workload` parses a spec string, checks its parameters and builds the graph.
"""

from __future__ import annotations

from collections.abc import Callable
import re
from dataclasses import dataclass, field
from typing import Any

from marssim.errors import InputError
from marssim.specs import coerce, field_like, format_spec, parse_params, split_spec

from .graph import Graph

__all__ = ["ZooEntry", "register", "zoo_entries", "parse_spec", "load_workload", "format_spec", "is_onnx_spec",
           "spec_mode"]


@dataclass(frozen=True)
class ZooEntry:
    """A built-in workload: builder, default parameters and a one-line description."""

    name: str
    build: Callable[..., Graph]
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    multi_model: bool = False
    group: str = "zoo"  # "zoo" (the CNN/BERT models) or "llm" (transformer families and presets)


_ZOO: dict[str, ZooEntry] = {}


def register(name: str, *, description: str, multi_model: bool = False, group: str = "zoo",
             **defaults: Any) -> Callable:
    """Decorator registering ``fn(**params) -> Graph`` as zoo workload ``name``."""

    def wrap(fn: Callable[..., Graph]) -> Callable[..., Graph]:
        _ZOO[name] = ZooEntry(name, fn, dict(defaults), description, multi_model, group)
        return fn

    return wrap


def zoo_entries() -> dict[str, ZooEntry]:
    """All registered zoo workloads by name (imports the zoo on first use)."""
    from . import llm, zoo  # noqa: F401  (registers the models)

    return dict(_ZOO)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"bert-base:seq=512,batch=4"`` into ``("bert-base", {"seq": "512", "batch": "4"})``
    (:func:`marssim.specs.split_spec`)."""
    parsed = split_spec(spec)
    return parsed.name, parsed.params


_ONNX_SPEC = re.compile(r"^(?P<path>.+\.onnx)(?::(?P<params>.*))?$", re.IGNORECASE | re.DOTALL)


def is_onnx_spec(spec: str) -> bool:
    """True for ``model.onnx`` and ``model.onnx:batch=8`` (any case of ``.onnx``)."""
    return _ONNX_SPEC.match(spec) is not None


def load_workload(spec: str, *, batch: int | None = None, recompute: str | None = None) -> Graph:
    """Build a workload from a zoo spec (``resnet50:batch=8``), an ONNX file path, optionally
    with a batch (``model.onnx:batch=8``), or a Hugging Face ``config.json``
    (``hf:PATH[:key=value,...]``).

    ``batch`` overrides the spec's batch. ``recompute``: a zoo LLM built with that
    recomputation, its ``spec`` still naming the workload as written (as a graph that
    :func:`marssim.parallel.prepare_graph` rebuilt for a configuration's recomputation is named).
    Raises InputError for an unknown name or parameter, or for parameter values the model cannot
    take (the key is named)."""
    from .llm.hf import is_hf_spec

    if recompute is not None and (is_hf_spec(spec) or is_onnx_spec(spec)):
        raise InputError(spec, "recompute", "is set here for a zoo LLM only; give it in the spec")
    if is_hf_spec(spec):
        from .llm.hf import load_hf

        graph = load_hf(spec, batch=batch)
        check_sizes(graph, spec)
        return graph
    onnx_spec = _ONNX_SPEC.match(spec)
    if onnx_spec:
        return _load_onnx_spec(spec, onnx_spec.group("path"), onnx_spec.group("params") or "", batch)
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
        params[key] = coerce(spec, key, value, field_like(entry.defaults[key]))
    if batch is not None:
        if "batch" not in params:
            raise InputError(spec, "batch", f"{name} takes no batch parameter")
        params["batch"] = batch
    built = params
    if recompute is not None:
        if "recompute" not in params:
            raise InputError(spec, "recompute", f"{name} takes no recompute parameter")
        built = {**params, "recompute": recompute}
    try:
        graph = entry.build(**built)
    except InputError as err:
        if err.file is None:  # a builder names the key; the spec is the "file"
            raise InputError(spec, problems=err.problems) from None
        raise
    except ValueError as err:  # a shape that does not work out (e.g. an image too small)
        raise InputError(spec, "", f"cannot build {name}: {err}") from None
    changed = {k: v for k, v in params.items() if v != entry.defaults[k]}
    graph.spec = format_spec(name, changed)
    check_sizes(graph, spec)
    return graph


def spec_mode(spec: str) -> str | None:
    """The mode (``train``, ``serve``, ``forward``, ...) a zoo LLM spec runs -- the spec's own
    ``mode`` or its model's default --, read from the spec alone, without building the graph; None
    for any other spec (an ONNX file, a Hugging Face config, a zoo model that is no LLM) and for a
    spec that does not parse (building it says why)."""
    from .llm.hf import is_hf_spec

    if is_hf_spec(spec) or is_onnx_spec(spec):
        return None
    try:
        name, raw = parse_spec(spec)
    except InputError:
        return None
    entry = zoo_entries().get(name)
    if entry is None or entry.group != "llm" or "mode" not in entry.defaults:
        return None
    return str(raw.get("mode", entry.defaults["mode"]))


MAX_OP_COUNT = 2**62
"""The most FLOPs or bytes one op may count: the cost models keep exact counts in 64-bit integers."""


def check_sizes(graph: Graph, spec: str) -> None:
    """Raise InputError when an op of ``graph`` counts more FLOPs or bytes than
    :data:`MAX_OP_COUNT` (a batch or sequence far beyond any real run, most likely a typo)."""
    for op in graph.ops:
        for what, value in (("FLOPs", op.flops), ("bytes", op.bytes_moved)):
            if value > MAX_OP_COUNT:
                raise InputError(spec, "", f"op {op.name!r} would count {value:.3g} {what}; expected at most "
                                           f"{MAX_OP_COUNT:.3g} per op (the cost models count in 64-bit integers), "
                                           "so the batch or sequence is far too large")


def _load_onnx_spec(spec: str, path: str, rest: str, batch: int | None) -> Graph:
    """``model.onnx``, ``model.onnx:batch=8`` or ``model.onnx:batch=8,dtype=fp16``."""
    raw = parse_params(spec, rest)
    for key in raw:
        if key not in ("batch", "dtype"):
            raise InputError(spec, key, "unknown parameter for an ONNX model; expected one of: batch, dtype")
    if batch is None and "batch" in raw:
        batch = coerce(spec, "batch", raw["batch"], field_like(1))
    from .onnx_import import load_onnx

    graph = load_onnx(path, batch=batch, dtype=raw.get("dtype"))
    check_sizes(graph, spec)
    return graph

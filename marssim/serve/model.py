"""The model a deployment serves, from a workload spec: ``llama3-70b``, ``llama3-8b:attention=flash``,
``gpt:layers=24,hidden=2048,heads=16``, or a Hugging Face configuration ``hf:PATH/config.json``
(:mod:`marssim.workload.llm.hf`). The requests decide the run (prompt and output tokens,
batch), so the settings of one run (``mode``, ``batch``, ``seq``, ``prompt``, ``generate``,
``context``) are refused. A mixture-of-experts model (``moe:``, ``mixtral-8x7b``) serves dropless
(every routed token reaches its expert; ``capacity_factor`` is a training setting), its routing
imbalance from ``expert_load`` (:mod:`.itermodel`).
"""

from __future__ import annotations

from dataclasses import replace

from marssim.errors import InputError
from marssim.workload.llm import require_transformer
from marssim.workload.llm.config import TransformerConfig
from marssim.workload.registry import parse_spec

__all__ = ["load_model", "RUN_KEYS"]

RUN_KEYS = ("mode", "batch", "seq", "prompt", "generate", "context", "recompute")


def load_model(spec: str) -> TransformerConfig:
    """The :class:`TransformerConfig` of ``spec`` (an LLM of the workload zoo), in serving
    form. Raises InputError naming the key."""
    from marssim.workload import load_workload
    from marssim.workload.llm.hf import hf_base, is_hf_spec, split_hf_spec
    from marssim.workload.registry import zoo_entries
    from marssim.specs import parse_params

    if is_hf_spec(spec):  # a Hugging Face config.json
        name, text = split_hf_spec(spec)
        params = parse_params(spec, text)
        base = hf_base(spec)[0]
        full = {"layers": base["layers"], "dense_layers": base.get("dense_layers", 0)}
        name = f"hf:{name}"
    else:
        name, params = parse_spec(spec)
        entry = zoo_entries().get(name)
        if entry is None or entry.group != "llm":
            llms = sorted(k for k, e in zoo_entries().items() if e.group == "llm")
            raise InputError(spec, "", f"expected an LLM of the workload zoo ({', '.join(llms)}) or "
                                       f"hf:PATH/config.json, got {name!r}")
        full = dict(entry.defaults)
    for key in params:
        if key in RUN_KEYS:
            raise InputError(spec, key, "is set by the requests (prompt and output tokens, batching); drop it")
    layers = params.pop("layers", None)
    dense = params.pop("dense_layers", None)
    full_dense = full.get("dense_layers", 0) or 0
    if dense is not None:
        try:
            full_dense = int(dense)
        except ValueError:
            raise InputError(spec, "dense_layers", f"expected a non-negative integer, got {dense!r}") from None
    # one block checks every setting; a mixture of experts' dense first blocks are set after
    small = ",".join([f"{k}={v}" for k, v in params.items()] + ["mode=prefill", "seq=2", "batch=1", "layers=1"]
                     + ([f"dense_layers={min(full_dense, 1)}"] if full_dense or dense is not None else []))
    graph = load_workload(f"{name}:{small}")
    config = require_transformer(graph, "a served model", spec)
    if layers is not None:
        try:
            full["layers"] = int(layers)
        except ValueError:
            raise InputError(spec, "layers", f"expected a positive integer, got {layers!r}") from None
        if full["layers"] < 1:
            raise InputError(spec, "layers", f"expected a positive integer, got {layers!r}")
    if full_dense > int(full["layers"]):
        raise InputError(spec, "dense_layers", f"expected at most the {full['layers']} layers, got {full_dense}")
    config = replace(config, layers=int(full["layers"]), dense_layers=full_dense if config.is_moe else 0,
                     mode="prefill", seq=1, batch=1, name=config.name)
    return config

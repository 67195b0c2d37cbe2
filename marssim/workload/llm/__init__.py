"""Large language models: decoder and mixture-of-experts transformers for training and serving.

Spec strings name a family with any dimension (``gpt:layers=96,hidden=12288,heads=96``,
``llama:...``, ``moe:...``) or a published model (``gpt3-175b``, ``llama3-70b``,
``mixtral-8x7b``) with overrides, and a mode (``mode=train``, ``prefill``, ``decode``,
``serve``): see :mod:`.config` (fields, presets, sources), :mod:`.forward` (the blocks),
:mod:`.autograd` (backward and optimizer), :mod:`.build` (the modes; :func:`transformer_of` and
:func:`require_transformer`, the configuration a graph was built from), :mod:`.tprole` (each
GEMM's tensor-parallel role) and :mod:`.footprint` (parameters, FLOPs per phase, memory).
"""

from __future__ import annotations

from typing import Any

from marssim.workload.registry import register

from .build import build_transformer, require_transformer, transformer_of
from .config import FAMILY_DEFAULTS, MODES, PRESETS, RECOMPUTE, TransformerConfig, config_from
from .footprint import Footprint, footprint

__all__ = ["TransformerConfig", "PRESETS", "FAMILY_DEFAULTS", "MODES", "RECOMPUTE", "build_transformer",
           "config_from", "Footprint", "footprint", "transformer_of", "require_transformer"]


def _entry(name: str, base: dict[str, Any], description: str) -> None:
    defaults = {k: v for k, v in base.items() if k != "family"}
    for key, value in TransformerConfig(name=name, **base).params_dict().items():
        if key != "family":
            defaults.setdefault(key, value)

    def build(**params: Any):
        return build_transformer(config_from(base, name, **params))

    register(name, description=description, group="llm", **defaults)(build)


for _name, (_base, _about) in FAMILY_DEFAULTS.items():
    _entry(_name, _base, _about)
for _name, (_base, _about) in PRESETS.items():
    _entry(_name, _base, _about)

"""Layer groups: the blocks a per-layer report adds ops up into, from the op names alone.

Op names of the zoo and of exported models are dotted paths (``layer2.1.conv3``,
``encoder.layer.7.attention.self.query``, ``h.11.mlp.c_fc``, ``features.5.conv.1``), a model
prefix ``resnet50/`` in multi-model mixes. A *block* is the name up to and including its first
purely numeric component (``layer2.1``, ``encoder.layer.7``, ``h.11``): one ResNet bottleneck,
one transformer block. A *stage* is the name before that component (``layer2``,
``encoder.layer``, ``h``): one ResNet stage. Ops without a numeric component (a stem ``conv1 ..
maxpool``, a head ``avgpool .. fc``, embeddings ``wte .. wpe``) are grouped by runs: the
consecutive such ops of one model, in graph order, form one group named ``first .. last``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LEVELS", "layer_groups"]

LEVELS = ("block", "stage")


def _key(name: str, level: str) -> str | None:
    model, slash, path = name.rpartition("/")
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit() and i > 0:
            cut = parts[:i + 1] if level == "block" else parts[:i]
            return f"{model}{slash}{'.'.join(cut)}"
    return None


def layer_groups(names: Sequence[str], level: str = "block", pipeline: Sequence[int] | None = None) -> list[str]:
    """The group of each op of ``names`` (graph order; see the module docstring), ``level``
    ``block`` or ``stage``; ``pipeline``: each op's pipeline stage in a parallel configuration's
    run, whose ``stage`` groups are its pipeline stages."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if level == "stage" and pipeline is not None:
        return [f"pipeline stage {s}" for s in pipeline]
    keys = [_key(n, level) for n in names]
    out: list[str] = [""] * len(names)
    i = 0
    while i < len(names):
        if keys[i] is not None:
            out[i] = keys[i]
            i += 1
            continue
        model = names[i].rpartition("/")[0]
        j = i
        while j + 1 < len(names) and keys[j + 1] is None and names[j + 1].rpartition("/")[0] == model:
            j += 1
        label = names[i] if i == j else f"{names[i]} .. {names[j].rpartition('/')[2] if model else names[j]}"
        out[i:j + 1] = [label] * (j - i + 1)
        i = j + 1
    return out

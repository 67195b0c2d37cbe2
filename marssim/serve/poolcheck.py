"""Whether a pool's parallelism can split a model: its tensor parallelism the attention heads,
key/value heads and MLP widths, its pipeline the layers, its expert parallelism the experts.
Shared by the simulation, the screen and a speculative draft's checks."""

from __future__ import annotations

from marssim.errors import InputError
from marssim.workload.llm.config import TransformerConfig

from .deployment import Pool

__all__ = ["check_pool"]


def check_pool(pool: Pool, config: TransformerConfig, where: str, prefix: str) -> None:
    """InputError when the pool's tensor or pipeline parallelism cannot split the model."""
    tp = pool.tp
    if config.heads % tp:
        raise InputError(where, prefix + "tp", f"expected a divisor of the {config.heads} attention heads, got {tp}")
    if config.kv % tp and tp % config.kv:
        raise InputError(where, prefix + "tp", f"expected a divisor or multiple of the {config.kv} key/value heads, "
                                               f"got {tp}")
    for width in config.split_widths:
        if width % tp:
            raise InputError(where, prefix + "tp", f"expected a divisor of the MLP width {width}, got {tp}")
    if pool.pp > config.layers:
        raise InputError(where, prefix + "pp", f"expected at most the {config.layers} layers, got {pool.pp}")
    if pool.ep != 1 and not config.is_moe:
        raise InputError(where, prefix + "ep", "expert parallelism needs a mixture-of-experts model")
    if pool.ep not in (1, tp):
        raise InputError(where, prefix + "ep", f"expected 1 (experts split over tp) or tp={tp} (whole experts over "
                                               f"the tensor-parallel GPUs), got {pool.ep}")
    if config.is_moe and config.experts % pool.ep:
        raise InputError(where, prefix + "ep", f"expected a divisor of the {config.experts} experts, got {pool.ep}")

"""How many KV-cache blocks a replica has: the GPU memory an engine may use, less the weights and
the activation workspace of its largest iteration, in blocks (vLLM's profile-then-allocate).

Per GPU of pipeline stage ``s`` (``tp`` ranks split every op by the lowering's rules):

* usable memory: ``gpu_memory_utilization x capacity`` (vLLM's and SGLang's rule), or, with
  ``kv_cache_free_gpu_mem_fraction`` ``f`` (TensorRT-LLM's rule), the whole capacity;
* weights: the rank's parameters of the stage's blocks (:func:`marssim.parallel.memory.rank_weight_bytes`
  on the model's own ops), the embedding on the first stage, the output projection on the last
  (a tied one is copied there when ``pp > 1``), each op's at the bytes the engine holds per
  parameter (:func:`marssim.workload.llm.precision.held_weight_bytes`: ``dtype=fp8``/``fp4``
  stores the blocks' GEMM weights quantized, 1 B / 0.5625 B, and the embedding, the output
  layer, the norms and the MoE router in bf16);
* workspace: one forward pass of ``max_batched_tokens`` tokens holds the residual stream and the
  largest op's inputs and output at once (attention as the engines run it, a fused kernel that
  keeps no scores), plus the logits of ``max_num_seqs`` sequences in fp32;
* KV cache: what is left (with ``f``: ``f x (capacity - weights - workspace)``, the share of the
  memory free after the weights and the activations that TensorRT-LLM gives its KV cache), in
  blocks of ``block_size`` tokens; a token takes
  ``2 x layers_s x ceil(kv_heads / tp) x head_dim`` elements on a rank (a key/value head is
  replicated when ``tp`` exceeds the key/value heads) at the cache's element size
  (``kv_dtype=fp8``: 1 B).

The replica has the blocks of its tightest stage. Units: bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from marssim.errors import InputError
from marssim.workload.op import DTYPE_BYTES

from .deployment import SchedulerConfig
from .itermodel import REF_BATCH, IterationModel, resize_tokens

__all__ = ["ReplicaMemory", "replica_memory"]


@dataclass(frozen=True)
class ReplicaMemory:
    """Bytes per GPU of each stage, and the replica's KV-cache blocks."""

    capacity: float
    usable: float
    weights: tuple[float, ...]
    workspace: tuple[float, ...]
    kv_bytes_per_token: tuple[float, ...]  # per GPU of each stage
    block_size: int
    blocks: int
    free_fraction: float = 0.0  # TensorRT-LLM's rule: the cache's share of the free memory (0: not used)

    @property
    def kv_bytes(self) -> tuple[float, ...]:
        """Bytes of the KV cache on a GPU of each stage."""
        return tuple(self.blocks * self.block_size * b for b in self.kv_bytes_per_token)

    def block_bytes(self, stage: int) -> float:
        """Bytes of one block on a GPU of ``stage``."""
        return self.block_size * self.kv_bytes_per_token[stage]

    def lines(self) -> list[str]:
        gib = 2**30
        rule = (f"KV cache {self.free_fraction:g} of the free memory" if self.free_fraction > 0 else
                f"x utilisation = {self.usable / gib:.1f} GiB")
        return [f"per GPU: {self.capacity / gib:.1f} GiB {rule}; weights "
                f"{max(self.weights) / gib:.2f} GiB, workspace {max(self.workspace) / gib:.2f} GiB, KV cache "
                f"{max(self.kv_bytes) / gib:.2f} GiB = {self.blocks:,} blocks of {self.block_size} tokens "
                f"({self.blocks * self.block_size:,} tokens)"]


def replica_memory(model: IterationModel, cfg: SchedulerConfig, capacity: float, where: str = "pool",
                   draft: tuple[float, float] = (0.0, 0.0)) -> ReplicaMemory:
    """The :class:`ReplicaMemory` of a replica timed by ``model`` with engine settings ``cfg`` on
    GPUs of ``capacity`` bytes; InputError when the weights and workspace leave no block.
    ``draft``: a speculative draft's ``(weight bytes, KV bytes per cached token)`` on each GPU of
    the first stage (:func:`~.speculative.draft_memory`), added to the model's."""
    from marssim.parallel.config import ParallelConfig
    from marssim.parallel.memory import rank_weight_bytes
    from marssim.parallel.partition import shard_loops

    t = model.config
    graph = model.graph
    eb = DTYPE_BYTES[t.dtype]
    held = rank_weight_bytes(graph, ParallelConfig(tp=model.tp, micro_batch=REF_BATCH), model.rules)
    tp, pp = model.tp, model.pp
    free_fraction = cfg.kv_cache_free_gpu_mem_fraction
    usable = capacity if free_fraction > 0 else cfg.gpu_memory_utilization * capacity
    tokens = cfg.max_batched_tokens
    peak_op = 0.0
    for op, rule in model.token_ops + model.dense_token_ops:
        if rule.alias:
            continue
        part = resize_tokens(op, 1, tokens, model.ref_tokens)
        sizes = shard_loops(part, rule, {}, 1)
        part = part.with_loops(**sizes) if sizes else part
        peak_op = max(peak_op, float(part.input_bytes + part.output_bytes) / rule.scale)
    residual = float(tokens * t.hidden * eb)
    logits = float(min(cfg.max_num_seqs, tokens) * -(-t.vocab // tp) * 4)
    kv_per_token_layer = 2 * -(-t.kv // tp) * t.d_head * DTYPE_BYTES[t.cache_dtype]
    weights, workspace, per_token = [], [], []
    blocks = None
    for s in range(pp):
        dense, main = model.stage_blocks[s]
        w = main * held.get(model.main_layer, 0.0)
        if dense:  # a mixture of experts' dense first blocks
            w += dense * held.get(0, 0.0)
        if s == 0:
            w += held.get(-1, 0.0)
        if s == pp - 1:
            w += held.get(model.template_layers, 0.0)
            if t.tie_embeddings and pp > 1:
                w += -(-t.vocab // tp) * t.hidden * eb
        w = float(w) + (draft[0] if s == 0 else 0.0)
        ws = peak_op + residual + (logits if s == pp - 1 else 0.0)
        kv_token = float(model.blocks[s] * kv_per_token_layer) + (draft[1] if s == 0 else 0.0)
        left = usable - w - ws
        if free_fraction > 0:
            left *= free_fraction
        n = int(left // (cfg.block_size * kv_token)) if left > 0 else 0
        if n < 1:
            gib = 2**30
            rule = (f"{free_fraction:g} of the free memory" if free_fraction > 0 else
                    f"{cfg.gpu_memory_utilization:g} x {capacity / gib:.1f} GiB")
            raise InputError(where, "tp", f"no room for a KV cache on a GPU of stage {s}: weights {w / gib:.2f} GiB "
                                          f"and workspace {ws / gib:.2f} GiB of {usable / gib:.2f} GiB usable "
                                          f"({rule}); more tp or pp, fewer max_batched_tokens, or GPUs with more "
                                          "memory")
        blocks = n if blocks is None else min(blocks, n)
        weights.append(w)
        workspace.append(ws)
        per_token.append(kv_token)
    return ReplicaMemory(float(capacity), float(usable), tuple(weights), tuple(workspace), tuple(per_token),
                         cfg.block_size, int(blocks), free_fraction)

"""The parallel configuration of a Megatron-LM-style run: how a transformer's training or serving
step is split over a GPU cluster.

=================  ===============================================================================
field              meaning (Megatron-LM's name)
=================  ===============================================================================
tp                 tensor parallelism (``--tensor-model-parallel-size``): column- then row-parallel
                   GEMM pairs in attention and MLP, one all-reduce per pair in forward and backward
sp                 sequence parallelism (``--sequence-parallel``): the all-reduces become
                   reduce-scatter + all-gather, norms and dropouts split along the sequence
pp                 pipeline parallelism (``--pipeline-model-parallel-size``)
dp                 data parallelism: gradients all-reduced (or reduce-scattered, ``zero``) in buckets
ep                 expert parallelism (``--expert-model-parallel-size``): experts split over ``ep``
                   ranks of the data-parallel group, all-to-all around them
schedule           ``gpipe``, ``1f1b`` or ``interleaved`` (``--num-layers-per-virtual-pipeline-stage``
                   via ``virtual_stages``)
micro_batch        sequences per micro-batch (``--micro-batch-size``)
global_batch       sequences per iteration (``--global-batch-size``); micro-batches per pipeline =
                   global / (micro_batch x dp)
recompute          ``none``, ``selective`` or ``full`` (``--recompute-granularity``)
zero               0: gradients all-reduced; 1 or 2: the optimizer state (1) and gradients (2) sharded
                   over dp (reduce-scatter of gradients, all-gather of parameters: Megatron's
                   distributed optimizer); 3: parameters sharded too, as DeepSpeed's ZeRO stage 3
                   runs it (:mod:`.zero3`): each module's parameters all-gathered before its forward
                   and again before its backward, with a bounded prefetch; gradients
                   reduce-scattered in buckets; nothing gathered after the optimizer step
zero3_prefetch     ZeRO-3: parameters (elements) prefetched at a module's hook
                   (``stage3_prefetch_bucket_size``, 5e7)
zero3_live         ZeRO-3: the most parameters gathered at once before a prefetch stops
                   (``stage3_max_live_parameters``, 1e9)
zero3_persist      ZeRO-3: parameters of fewer elements stay gathered on every rank
                   (``stage3_param_persistence_threshold``, 1e5)
zero3_reuse        ZeRO-3: a module used again within this many parameters of other modules is
                   kept gathered (``stage3_max_reuse_distance``, 1e9)
zero3_bucket       ZeRO-3: gradient elements per reduce-scatter bucket (``reduce_bucket_size``, 5e8)
layers_per_stage   layers of each pipeline stage (default: balanced; the embedding lives on the first
                   stage, the output layer and the loss on the last)
stage_tp           tensor parallelism of each stage (default: ``tp`` everywhere): a stage runs on
                   ``stage_tp[s] * dp`` GPUs
stage_start        the index (in the system's accelerator order) of each stage's first GPU: stage
                   ``s`` runs on the ``stage_tp[s] * dp`` consecutive GPUs from there, the
                   tensor-parallel ranks innermost (default: ranks placed along ``order``); on a
                   cluster of several GPU kinds this chooses which nodes form each stage
order              rank placement, innermost first: ``tp-pp-dp`` puts the tensor-parallel ranks of a
                   group on consecutive GPUs (inside a node), then the pipeline stages, then the
                   data-parallel replicas; left out, the system's default
                   (:func:`marssim.parallel.placement.default_order`: Megatron-LM's ``tp-dp-pp``
                   where it keeps expert-parallel or, on a rack-scale domain, data-parallel groups
                   inside one NVLink domain)
bucket             parameters per data-parallel gradient bucket (Megatron-LM's default: 40 M)
overlap_grad_reduce
                   the gradient buckets reduced while the backward runs (``--overlap-grad-reduce``);
                   off: every bucket after the last backward
cp                 context parallelism (``--context-parallel-size``): every sequence split into ``2 cp``
                   chunks, rank ``i`` of the group keeping chunks ``i`` and ``2 cp - 1 - i`` (the load
                   balancing of causal masks); the attention core a ring of ``cp`` steps passing key/value
                   blocks around the group, each step's transfer overlapped with the attention of the
                   block before it (Transformer Engine's ``AttnFuncWithCPAndKVP2P``); gradients reduced
                   and the distributed optimizer sharded over ``dp x cp`` ranks
tp_comm_overlap    tensor-parallel communication overlapped with its GEMMs (``--tp-comm-overlap``,
                   Transformer Engine's userbuffers): the all-gather before a column-parallel GEMM (and
                   before a row-parallel GEMM's input-gradient GEMM) pipelined with it in ``tp`` chunks
                   (``ring_exchange``), the reduce-scatter after a row-parallel GEMM in 4 chunks
                   (``pipeline``, the GEMM on all but 16 of the GPU's SMs); needs ``sp``
overlap_param_gather
                   the distributed optimizer's parameter all-gather overlapped with the next forward
                   (``--overlap-param-gather``): bucket by bucket, each layer's first forward waits for its
                   bucket; needs ``zero`` 1 or 2 and ``overlap_grad_reduce``
etp                expert tensor parallelism (``--expert-tensor-parallel-size``; 0: the tensor-parallel
                   degree, Megatron-LM's default): the experts' GEMMs split over ``etp`` ranks of the
                   tensor-parallel group, their tokens all-gathered over it after the all-to-all
                   (:mod:`.experts`); 1: whole experts on every rank
overlap_p2p_comm   pipeline sends and receives asynchronous (``--overlap-p2p-communication``, the
                   interleaved schedule's); off (as Megatron-LM runs 1F1B): a GPU's next kernel waits
                   until its send to the neighbouring stage has completed
account_for_embedding, account_for_loss
                   the embedding (the output layer and loss) counted as one layer when the layers are
                   split over the model chunks (``--account-for-embedding-in-pipeline-split``,
                   ``--account-for-loss-in-pipeline-split``): ``layers + 2`` split evenly, the first
                   chunk holding one block fewer, the last one fewer (Llama 3.1 405B's 126 layers in
                   64 chunks of 2)
=================  ===============================================================================

What a Megatron-LM iteration runs beyond the workload graph's ops (:mod:`.megatron`, each with its
source there), each a switch whose default is what Megatron-LM does:

=====================  ===========================================================================
field                  meaning (Megatron-LM's name)
=====================  ===========================================================================
collectives            ``nccl``: collectives as NCCL runs them (algorithm, protocol, measured or
                       fitted time, :mod:`marssim.collectives`); ``line``: rings at the links'
                       line rate
bias_gelu_fusion       the MLP's bias add and GeLU one kernel (``--no-bias-gelu-fusion``)
bias_dropout_fusion    bias add, dropout and residual add one kernel (``--no-bias-dropout-fusion``)
masked_softmax_fusion  scaling, causal mask and softmax one kernel (``--no-masked-softmax-fusion``)
persist_layer_norm     apex's persistent LayerNorm kernel where the hidden size allows it
                       (``--no-persist-layer-norm``)
fused_adam             the optimizer step one multi-tensor kernel (apex's or Transformer Engine's
                       FusedAdam); false: PyTorch's ``AdamW`` (``foreach``), Megatron-LM's fallback
clip_grad              clip gradients by their global L2 norm above this (``--clip-grad``, 1.0);
                       0: no norm, no clipping
grads_clipped          whether the norm exceeds ``clip_grad`` so that the gradients are scaled
                       (data-dependent; Megatron-LM scales only then)
grad_reduce_dtype      the gradient buffer and its data-parallel reduction: ``auto`` as Megatron-LM
                       (fp32 for bf16 training, ``--accumulate-allreduce-grads-in-fp32``; the
                       model's type for fp16), or ``fp32``, ``bf16``, ``fp16``
optimizer_dtype        the optimizer's state: ``fp32`` (Megatron-LM: fp32 master weights and Adam's
                       two moments, 12 B a parameter) or ``bf16`` (Apex's DistributedFusedAdam with
                       ``dtype: bf16``, as NeMo's Nemotron-340B configuration: the moments in bf16
                       and the bf16 weights updated in place, no master copy, 4 B a parameter;
                       needs ``fused_adam`` and a bf16 model without ``fp8_param_gather``)
scatter_gather         pipeline activations sent as ``1/tp`` per rank and all-gathered after
                       (``--no-scatter-gather-tensors-in-pipeline``; not with sequence
                       parallelism, whose activations are split already)
host_gaps              the GPU waits for the host where its kernels are shorter than their launch
                       (:mod:`.host`; measured host times of the device and stack)
=====================  ===========================================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from marssim.errors import InputError
from marssim.specs import Field, coerce, split_spec

__all__ = ["ParallelConfig", "SCHEDULES", "ORDERS", "parse_parallel", "parallel_problems", "check_parallel"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")
ZERO3_KEYS = ("zero3_prefetch", "zero3_live", "zero3_persist", "zero3_reuse", "zero3_bucket")
ORDERS = ("tp-pp-dp", "tp-dp-pp", "pp-tp-dp", "dp-tp-pp", "pp-dp-tp", "dp-pp-tp")


@dataclass(frozen=True)
class ParallelConfig:
    """A parallel configuration (see the module docstring). Immutable and hashable."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    sp: bool = False
    ep: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    micro_batch: int = 1
    global_batch: int = 0  # 0: one micro-batch per data-parallel replica
    recompute: str = "none"
    zero: int = 0
    layers_per_stage: tuple[int, ...] = ()
    stage_tp: tuple[int, ...] = ()
    stage_start: tuple[int, ...] = ()
    order: str = "tp-pp-dp"
    bucket: int = 40_000_000
    overlap_grad_reduce: bool = True
    collectives: str = "nccl"
    bias_gelu_fusion: bool = True
    bias_dropout_fusion: bool = True
    masked_softmax_fusion: bool = True
    persist_layer_norm: bool = True
    fused_adam: bool = True
    clip_grad: float = 1.0
    grads_clipped: bool = False
    grad_reduce_dtype: str = "auto"
    optimizer_dtype: str = "fp32"
    scatter_gather: bool = True
    host_gaps: bool = True

    @property
    def nccl(self) -> bool:
        """Collectives as NCCL runs them (else rings at the links' line rate)."""
        return self.collectives == "nccl"
    cp: int = 1
    tp_comm_overlap: bool = False
    overlap_param_gather: bool = False
    overlap_p2p_comm: bool = False
    etp: int = 0
    account_for_embedding: bool = False
    account_for_loss: bool = False
    zero3_prefetch: int = 50_000_000
    zero3_live: int = 1_000_000_000
    zero3_persist: int = 100_000
    zero3_reuse: int = 1_000_000_000
    zero3_bucket: int = 500_000_000

    @property
    def gpus(self) -> int:
        return sum(self.tp_of(s) for s in range(self.pp)) * self.dp * self.cp

    @property
    def dp_cp(self) -> int:
        """Ranks of the data-parallel group with context parallelism (``dp x cp``): those that
        reduce a parameter's gradients and share the distributed optimizer's state
        (Megatron-LM's ``data_parallel_group_with_cp``)."""
        return self.dp * self.cp

    def tp_of(self, stage: int) -> int:
        """Tensor parallelism of pipeline stage ``stage``."""
        return self.stage_tp[stage] if self.stage_tp else self.tp

    def etp_of(self, stage: int) -> int:
        """Expert tensor parallelism of pipeline stage ``stage`` (``etp``, else its tensor
        parallelism)."""
        return self.etp or self.tp_of(stage)

    @property
    def uniform(self) -> bool:
        """Every stage has the same tensor parallelism and the default placement."""
        return not self.stage_tp or len(set(self.stage_tp)) == 1

    @property
    def batch(self) -> int:
        """Sequences per iteration."""
        return self.global_batch or self.micro_batch * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches each pipeline runs per iteration (gradient accumulation steps)."""
        return max(1, self.batch // (self.micro_batch * self.dp))

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what a mapping file stores)."""
        default = ParallelConfig()
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def text(self) -> str:
        """``tp=8,pp=2,dp=8,...``: the non-default fields."""
        parts = []
        for key, value in self.to_dict().items():
            if isinstance(value, list):
                value = "/".join(str(v) for v in value)
            elif isinstance(value, bool):
                value = str(value).lower()
            parts.append(f"{key}={value}")
        return ",".join(parts) or "tp=1"

    def with_(self, **changes: Any) -> "ParallelConfig":
        return replace(self, **changes)


FIELDS: dict[str, Field] = {
    "tp": Field("int", low=1), "pp": Field("int", low=1), "dp": Field("int", low=1), "ep": Field("int", low=1),
    "sp": Field("bool"), "schedule": Field("str", choices=SCHEDULES), "virtual_stages": Field("int", low=1),
    "micro_batch": Field("int", low=1), "global_batch": Field("int", low=1),
    "recompute": Field("str", choices=("none", "selective", "full")), "zero": Field("int", low=0, high=3),
    "layers_per_stage": Field("ints", low=0), "stage_tp": Field("ints", low=1), "stage_start": Field("ints", low=0),
    "order": Field("str", choices=ORDERS), "bucket": Field("int", low=1), "overlap_grad_reduce": Field("bool"),
    "collectives": Field("str", choices=("nccl", "line")), "bias_gelu_fusion": Field("bool"),
    "bias_dropout_fusion": Field("bool"), "masked_softmax_fusion": Field("bool"), "persist_layer_norm": Field("bool"),
    "fused_adam": Field("bool"),
    "clip_grad": Field("float", low=0.0), "grads_clipped": Field("bool"),
    "grad_reduce_dtype": Field("str", choices=("auto", "fp32", "bf16", "fp16")), "scatter_gather": Field("bool"),
    "optimizer_dtype": Field("str", choices=("fp32", "bf16")),
    "host_gaps": Field("bool"),
    "cp": Field("int", low=1), "tp_comm_overlap": Field("bool"), "overlap_param_gather": Field("bool"),
    "overlap_p2p_comm": Field("bool"), "etp": Field("int", low=0),
    "account_for_embedding": Field("bool"), "account_for_loss": Field("bool"),
    "zero3_prefetch": Field("int", low=0), "zero3_live": Field("int", low=0), "zero3_persist": Field("int", low=0),
    "zero3_reuse": Field("int", low=0), "zero3_bucket": Field("int", low=1),
}
"""How each setting of a configuration is written (``global_batch``: at least 1 when given; left out,
one micro-batch per data-parallel replica)."""


def parse_parallel(data: Any, where: str = "--parallel", base: ParallelConfig | None = None) -> ParallelConfig:
    """A :class:`ParallelConfig` from a mapping (YAML) or a string ``tp=8,pp=2,dp=8,sp=true``
    (``layers_per_stage`` as ``10/12/12/14``), on top of ``base`` (default: the defaults).
    Raises InputError naming the key (:mod:`marssim.specs`)."""
    if isinstance(data, str):
        if not data.strip():
            raise InputError(where, "", "expected settings like tp=8,pp=2,dp=8, got nothing")
        data = split_spec(data, named=False).params
    if not isinstance(data, dict) or not data:
        raise InputError(where, "", f"expected settings like {{tp: 8, pp: 2, dp: 8}}, got {data!r}")
    values: dict[str, Any] = asdict(base) if base is not None else {}
    for key, value in data.items():
        key = str(key)
        if key not in FIELDS:
            raise InputError(where, key, f"unknown parallel setting; expected one of: {', '.join(sorted(FIELDS))}")
        values[key] = coerce(where, key, value, FIELDS[key])
    return ParallelConfig(**values)


def parallel_problems(cfg: ParallelConfig, transformer, gpus: int) -> list[tuple[str, str]]:
    """Every reason ``cfg`` cannot run ``transformer`` (a
    :class:`~marssim.workload.llm.TransformerConfig`) on ``gpus`` GPUs, as ``(key, message)``."""
    t = transformer
    out: list[tuple[str, str]] = []
    if cfg.stage_tp and len(cfg.stage_tp) != cfg.pp:
        out.append(("stage_tp", f"expected {cfg.pp} degrees (one per stage), got {len(cfg.stage_tp)}"))
        return out
    if cfg.gpus != gpus:
        cp = f" x cp {cfg.cp}" if cfg.cp > 1 else ""
        what = (f"tp x pp x dp = {cfg.tp} x {cfg.pp} x {cfg.dp}{cp}" if not cfg.stage_tp else
                f"(stage tp {'+'.join(map(str, cfg.stage_tp))}) x dp {cfg.dp}{cp}")
        out.append(("tp" if not cfg.stage_tp else "stage_tp", f"{what} = {cfg.gpus}; expected the system's {gpus} GPUs"))
    key = "stage_tp" if cfg.stage_tp else "tp"
    for tp in sorted(set(cfg.tp_of(s) for s in range(cfg.pp))):
        if t.heads % tp:
            out.append((key, f"expected a divisor of the {t.heads} attention heads, got {tp}"))
        elif t.kv % tp and tp % t.kv:
            out.append((key, f"expected a divisor or multiple of the {t.kv} key/value heads, got {tp}"))
        for width in t.split_widths:
            if width % tp:
                out.append((key, f"expected a divisor of the MLP width {width}, got {tp}"))
                break
        if cfg.sp and t.mode != "decode" and (t.seq % (tp * cfg.cp)):
            out.append(("sp", f"the sequence ({t.seq}) must split evenly over tp={tp}"
                              + (f" x cp={cfg.cp}" if cfg.cp > 1 else "")))
    if cfg.sp and min(cfg.tp_of(s) for s in range(cfg.pp)) == 1:
        out.append(("sp", "sequence parallelism splits along the tensor-parallel group; needs tp > 1"))
    if cfg.optimizer_dtype != "fp32":
        if not cfg.fused_adam:
            out.append(("optimizer_dtype", "a bf16 optimizer state is the fused optimizer's (Apex's "
                                           "DistributedFusedAdam); needs fused_adam=true"))
        elif t.dtype != "bf16" or t.fp8_param_gather:
            out.append(("optimizer_dtype", "a bf16 state updates the bf16 weights in place; needs a bf16 model "
                                           "(dtype bf16, fp8 or fp4) without fp8_param_gather"))
    if cfg.stage_start:
        if len(cfg.stage_start) != cfg.pp:
            out.append(("stage_start", f"expected {cfg.pp} first GPUs (one per stage), got {len(cfg.stage_start)}"))
        else:
            blocks = sorted((cfg.stage_start[s], cfg.stage_start[s] + cfg.tp_of(s) * cfg.dp_cp) for s in range(cfg.pp))
            at = 0
            for lo, hi in blocks:
                if lo != at:
                    out.append(("stage_start", f"the stages' blocks of GPUs must tile the {gpus} GPUs without gaps or "
                                               f"overlaps; GPU {min(lo, at)} is covered {'twice' if lo < at else 'by none'}"))
                    break
                at = hi
    if cfg.etp and not t.is_moe:
        out.append(("etp", "expert tensor parallelism needs a mixture-of-experts model"))
    if t.is_moe and max(cfg.tp_of(s) for s in range(cfg.pp)) > 1 and not cfg.sp:
        out.append(("sp", "mixture-of-experts layers with tp > 1 need sequence parallelism (as Megatron-LM requires)"))
    layers = t.layers
    chunks = cfg.pp * (cfg.virtual_stages if cfg.schedule == "interleaved" else 1)
    counted = layers + cfg.account_for_embedding + cfg.account_for_loss  # the layers a split divides
    if cfg.layers_per_stage and (cfg.account_for_embedding or cfg.account_for_loss):
        key = "account_for_embedding" if cfg.account_for_embedding else "account_for_loss"
        out.append((key, "applies to the balanced split (give layers_per_stage or this, not both)"))
    elif (cfg.account_for_embedding or cfg.account_for_loss) and counted // chunks < 1:
        key = "account_for_embedding" if cfg.account_for_embedding else "account_for_loss"
        out.append((key, f"splits {counted} counted layers over {chunks} model chunks "
                         f"({layers} layers, the embedding and the loss counted): expected at least one per chunk"))
    if cfg.layers_per_stage:
        if len(cfg.layers_per_stage) != cfg.pp:
            out.append(("layers_per_stage", f"expected {cfg.pp} layer counts (one per stage), got "
                                            f"{len(cfg.layers_per_stage)}"))
        elif sum(cfg.layers_per_stage) != layers:
            out.append(("layers_per_stage", f"expected counts summing to the {layers} layers, got "
                                            f"{sum(cfg.layers_per_stage)}"))
        if cfg.schedule == "interleaved":
            out.append(("layers_per_stage", "is not supported with the interleaved schedule (its chunks are even)"))
    elif cfg.pp > layers:
        out.append(("pp", f"expected at most the {layers} layers, got {cfg.pp}"))
    elif cfg.schedule == "interleaved" and counted % chunks:
        counted_text = f"{layers} layers" + (f" (+{counted - layers} counted for the embedding and loss)"
                                             if counted != layers else "")
        out.append(("virtual_stages", f"the {counted_text} must split into pp x virtual_stages = {chunks} chunks"))
    if cfg.schedule == "interleaved":
        if not cfg.uniform or cfg.stage_start:
            out.append(("schedule", "the interleaved schedule needs uniform stages (no stage_tp or stage_start)"))
        if cfg.virtual_stages < 2:
            out.append(("virtual_stages", "the interleaved schedule needs virtual_stages >= 2"))
        if cfg.pp < 2:
            out.append(("pp", "the interleaved schedule needs pp >= 2"))
    elif cfg.virtual_stages != 1:
        out.append(("virtual_stages", f"applies to schedule=interleaved, got schedule={cfg.schedule}"))
    if t.training:
        if cfg.global_batch and cfg.global_batch % (cfg.micro_batch * cfg.dp):
            out.append(("global_batch", f"expected a multiple of micro_batch x dp = {cfg.micro_batch * cfg.dp}, "
                                        f"got {cfg.global_batch}"))
        if cfg.schedule == "interleaved" and cfg.micro_batches % cfg.pp:
            out.append(("global_batch", f"the interleaved schedule needs micro-batches ({cfg.micro_batches}) "
                                        f"divisible by pp={cfg.pp}"))
    if t.batch != cfg.micro_batch:
        out.append(("micro_batch", f"the workload's batch ({t.batch}) is one micro-batch; expected micro_batch="
                                   f"{t.batch}"))
    if cfg.ep > 1:
        if not t.is_moe:
            out.append(("ep", "expert parallelism needs a mixture-of-experts model"))
        elif t.experts % cfg.ep:
            out.append(("ep", f"expected a divisor of the {t.experts} experts, got {cfg.ep}"))
        if cfg.etp and any(cfg.tp_of(s) % cfg.etp for s in range(cfg.pp)):
            out.append(("etp", f"expert tensor parallelism splits within the tensor-parallel group: expected a divisor "
                               f"of tp, got {cfg.etp}"))
        for stage in range(cfg.pp):
            tp, etp = cfg.tp_of(stage), cfg.etp_of(stage)
            if tp % etp:
                break  # refused above
            ranks = tp * cfg.dp_cp
            if ranks % (etp * cfg.ep):
                group = f"tp x dp x cp={ranks}" if cfg.cp > 1 else f"tp x dp={ranks}"
                out.append(("ep", f"expert-parallel ranks come from a stage's tensor- and data-parallel ranks, "
                                  f"etp={etp} of them a rank (Megatron-LM's expert order etp, ep, expert data "
                                  f"parallelism): expected ep x etp dividing {group}, got ep={cfg.ep}"))
                break
    if t.mode == "serve" and cfg.pp > 1:
        out.append(("pp", "a serving run (mode=serve) takes one pipeline stage: its decode steps read the token the "
                          "last stage samples (mode=prefill and mode=decode take pp > 1)"))
    out.extend(_overlap_problems(cfg, t))
    if cfg.zero and not t.training:
        out.append(("zero", "applies to training"))
    if cfg.zero != 3:
        default = ParallelConfig()
        for key in ZERO3_KEYS:
            if getattr(cfg, key) != getattr(default, key):
                out.append((key, f"applies to zero=3 (DeepSpeed's ZeRO stage 3), got zero={cfg.zero}"))
    if cfg.recompute != "none" and not t.training:
        out.append(("recompute", "applies to training"))
    return out


def _overlap_problems(cfg: ParallelConfig, t) -> list[tuple[str, str]]:
    """The problems of the context-parallel and overlap settings (Megatron-LM's argument checks)."""
    out: list[tuple[str, str]] = []
    if cfg.cp > 1:
        if not t.training:
            out.append(("cp", f"context parallelism applies to training (mode=train), got mode={t.mode}"))
        elif t.seq % (2 * cfg.cp):
            out.append(("cp", f"the sequence ({t.seq}) must be a multiple of 2 x cp = {2 * cfg.cp} (each rank "
                              "keeps two of its 2 cp chunks, the load balancing of causal masks)"))
        if t.attention == "unfused":
            out.append(("cp", "context parallelism runs in Transformer Engine's fused attention: give the workload "
                              "attention=flash, cudnn or efficient"))
    if cfg.tp_comm_overlap:
        if not cfg.sp:
            out.append(("tp_comm_overlap", "overlaps the all-gathers and reduce-scatters of sequence parallelism: "
                                           "needs sp=true (as Megatron-LM requires)"))
    if cfg.overlap_param_gather:
        if cfg.zero not in (1, 2):
            out.append(("overlap_param_gather", f"overlaps the distributed optimizer's parameter all-gather: needs "
                                                f"zero=1 or 2, got zero={cfg.zero}"))
        if not cfg.overlap_grad_reduce:
            out.append(("overlap_param_gather", "needs overlap_grad_reduce=true (as Megatron-LM requires)"))
    if cfg.overlap_p2p_comm:
        if cfg.pp < 2:
            out.append(("overlap_p2p_comm", "overlaps pipeline sends and receives: needs pp >= 2"))
        elif cfg.schedule == "1f1b":
            out.append(("overlap_p2p_comm", "Megatron-LM overlaps pipeline communication in the interleaved "
                                            "schedule only (it turns the setting off for 1F1B): use "
                                            "schedule=interleaved"))
    return out


def check_parallel(cfg: ParallelConfig, transformer, gpus: int, where: str = "--parallel") -> None:
    """Raise one InputError listing every problem of ``cfg`` (see :func:`parallel_problems`)."""
    problems = parallel_problems(cfg, transformer, gpus)
    if problems:  # one line: the first problem, then the others
        key, message = problems[0]
        rest = "".join(f"; {k}: {m}" for k, m in problems[1:])
        raise InputError(where, key, message + rest)

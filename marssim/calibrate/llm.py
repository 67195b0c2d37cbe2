"""The calibration grid of the LLM workloads: every kernel shape the simulator asks the cost model
for when it times GPT-3 and Llama-3 layers under tensor parallelism.

Pure and deterministic; no GPU, no torch. The shapes are *derived*, not listed: for every run
(:func:`llm_runs`) the workload graph is built with :func:`marssim.workload.load_workload` (two
blocks: every block of a model has the same shapes) and each op is cut as the parallel lowering
cuts it (:func:`tp_shards`: :func:`marssim.parallel.roles.rule_for` in graph order, then the
lowering's split -- ``ceil(size * num / den)`` of each split loop, the AdamW step over the
parameters one rank of the group holds). The shard's :class:`~marssim.calibrate.grid.GridPoint`
carries the very :func:`~marssim.cost.calibrated.shape_key` the cost model looks it up by (its
kernel phase and fused attention backend included), so a measured row is charged exactly where
the simulator asks (tested against the lowering itself on small configurations).

The runs (:class:`LlmGridOptions`, defaults):

=============  ==============================================================================
models         ``gpt3-175b``, ``gpt3-13b``, ``llama3-8b``, ``llama3-70b`` (any LLM spec works)
tensor-        ``tp`` 1, 2, 4, 8; for training with ``tp > 1`` with and without sequence
parallel       parallelism (norms, dropouts and residual adds split along the tokens)
training       ``mode=train``, micro-batches of 1, 2 and 4 sequences of 2,048 tokens (GPT-3:
               its context) or 4,096 tokens (Llama 3: half its 8,192-token pre-training
               context, the length Megatron-LM's Llama recipes fit at micro-batch 1-2):
               forward, input-gradient and weight-gradient GEMMs (QKV, attention output, MLP
               up/gate/down or fc1/fc2, the output layer over the vocabulary padded to ``tp``
               equal parts), the attention products and their gradients, softmax, dropout,
               GeLU/SwiGLU, rotary embeddings, LayerNorm/RMSNorm and their gradients, the
               cross-entropy gradient, embeddings and their gradients, the AdamW step of each
               parameter group (fp32, without ZeRO sharding)
prefill        ``mode=prefill``, one prompt of the training length
decode         ``mode=decode``: one token for each of 1, 8, 32, 64 sequences over a KV cache of
               1,024, 2,048, 4,096, 8,192 tokens (at most the model's position table)
attention      every run unfused (``Q K^T``, softmax, ``P V`` as ops) and fused
               (``attention=flash``: one kernel per block forward and backward); the fused ops'
               shapes measured for every backend of PyTorch's scaled-dot-product attention:
               ``flash``, ``efficient`` and ``cudnn`` (what ``attention=flash``, ``efficient``,
               ``cudnn`` workloads are charged) and ``math`` (PyTorch's unfused composite, for
               comparison: no workload option models it, its scores are materialised)
dtype          the models' ``bf16`` (the AdamW step is fp32)
=============  ==============================================================================

Shapes that repeat across runs (the same GEMM at ``tp=2`` with micro-batch 2 and ``tp=4``
with micro-batch 4, every recomputed op) are kept once, with the first run that asked for them
as their origin. Reshapes (the KV-cache writes, the next-token choice, an MoE model's dispatch
and combine) are not timed by the harness and are left out. Mixture-of-experts specs work too
(grouped expert GEMMs, the router), with expert parallelism 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from marssim.errors import InputError
from marssim.workload import Graph, Op, OpKind
from marssim.workload.llm import require_transformer, transformer_of

from .grid import SDPA, GridPoint, _point

__all__ = ["DEFAULT_LLM_MODELS", "LLM_KINDS", "LlmGridOptions", "LlmRun", "llm_runs", "tp_shards", "llm_grid",
           "op_hints"]

DEFAULT_LLM_MODELS = ("gpt3-175b", "gpt3-13b", "llama3-8b", "llama3-70b")
LLM_KINDS = ("gemm", "attention", SDPA, "elementwise", "norm", "softmax", "embedding")
"""The measure kinds of the LLM grid, in the order the grid lists them."""
TRAIN_SEQ = {"gpt": 2048, "llama": 4096, "moe": 4096}
"""Tokens per training sequence by model family (see the module docstring)."""


@dataclass(frozen=True)
class LlmGridOptions:
    """Which runs the LLM grid derives its shapes from (see the module docstring). ``seq``:
    tokens per training sequence and prefill prompt (0: :data:`TRAIN_SEQ` of the family);
    ``layers``: blocks per graph (shapes do not depend on it); ``backends``: the
    scaled-dot-product attention backends the fused attention shapes are measured for."""

    models: tuple[str, ...] = DEFAULT_LLM_MODELS
    tp: tuple[int, ...] = (1, 2, 4, 8)
    micro_batches: tuple[int, ...] = (1, 2, 4)
    seq: int = 0
    train: bool = True
    prefill: bool = True
    decode_contexts: tuple[int, ...] = (1024, 2048, 4096, 8192)
    decode_batches: tuple[int, ...] = (1, 8, 32, 64)
    attention: tuple[str, ...] = ("unfused", "flash")
    backends: tuple[str, ...] = ("flash", "efficient", "cudnn", "math")
    dtype: str = "bf16"
    layers: int = 2


@dataclass(frozen=True)
class LlmRun:
    """One run: the workload ``spec`` (built with ``layers`` blocks), its parallel configuration
    and its label (``tp=4,sp``); a point's origin is ``spec:op label``."""

    spec: str
    parallel: "object"  # marssim.parallel.ParallelConfig
    label: str


def _join(model: str, params: str) -> str:
    return f"{model}{',' if ':' in model else ':'}{params}"


def _model_config(model: str, dtype: str):
    """The transformer configuration of ``model`` (a spec such as ``llama3-8b`` or
    ``llama:hidden=512,...``); InputError when it is not an LLM workload."""
    from marssim.workload import load_workload
    from marssim.workload.registry import parse_spec, zoo_entries

    entry = zoo_entries().get(parse_spec(model)[0]) if ".onnx" not in model else None
    if entry is None or entry.group != "llm":
        raise InputError(model, "", "expected an LLM workload (gpt, llama, moe or a preset such as llama3-8b)")
    graph = load_workload(_join(model, f"mode=forward,layers=1,seq=1,batch=1,dtype={dtype}"))
    return require_transformer(graph, "an LLM kernel grid", model)


def llm_runs(options: LlmGridOptions = LlmGridOptions()) -> list[LlmRun]:
    """Every run of ``options`` whose parallel configuration can run its model (configurations
    :func:`marssim.parallel.config.parallel_problems` refuses -- a ``tp`` that does not divide the
    heads -- are left out), in order: model, training, prefill, decode; then attention, ``tp``,
    sequence parallelism, micro-batch or context and batch."""
    from marssim.parallel.config import ParallelConfig, parallel_problems

    runs: list[LlmRun] = []
    for model in options.models:
        cfg = _model_config(model, options.dtype)
        seq = options.seq or TRAIN_SEQ.get(cfg.family, 2048)
        settings: list[tuple[str, int, bool]] = []  # (spec parameters, micro-batch, sequence parallel allowed)
        if options.train:
            settings += [(f"mode=train,seq={seq},batch={b}", b, True) for b in options.micro_batches]
        if options.prefill:
            settings.append((f"mode=prefill,seq={seq},batch=1", 1, False))
        limit = cfg.max_positions if cfg.positions == "learned" else None
        settings += [(f"mode=decode,context={c},batch={b}", b, False) for c in options.decode_contexts
                     for b in options.decode_batches if limit is None or c <= limit]
        for attention in options.attention:
            for params, batch, sp_allowed in settings:
                text = params + (f",attention={attention}" if attention != "unfused" else "") \
                    + (f",dtype={options.dtype}" if options.dtype != cfg.dtype else "")
                spec = _join(model, text)
                run_cfg = replace(cfg, **dict(_parse(text)))
                for tp in options.tp:
                    for sp in ((False, True) if sp_allowed and tp > 1 else (False,)):
                        parallel = ParallelConfig(tp=tp, sp=sp, micro_batch=batch)
                        if parallel_problems(parallel, run_cfg, parallel.gpus):
                            continue
                        label = f"tp={tp}" + (",sp" if sp else "")
                        runs.append(LlmRun(spec, parallel, label))
    return runs


def _parse(text: str) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for part in text.split(","):
        key, _, value = part.partition("=")
        out.append((key, int(value) if value.isdigit() else value))
    return out


def tp_shards(graph: Graph, parallel) -> list[tuple[Op, Op]]:
    """``(op, shard)`` for every op of ``graph`` (an LLM workload of one micro-batch) that the
    parallel lowering times under ``parallel``: the part one GPU runs, as
    :func:`marssim.parallel.lower.lower_parallel` passes it to the cost model -- the tensor-parallel
    rule of :func:`marssim.parallel.roles.rule_for` (in graph order, the output layouts of the
    producers known), each split loop cut to ``ceil(size * num / den)``, the AdamW step over the
    parameters a rank of the group holds (a ``1/dp`` part of them with ZeRO), the FP8 (FP4) weight
    cast after it over the rank's low-precision GEMM weights (its ``1/dp`` shard when the
    distributed optimizer gathers them in FP8), as :func:`marssim.parallel.overlap.step_casts`
    counts them. Graph inputs and views are not timed."""
    from marssim.parallel.memory import low_precision_rank_parameters, rank_parameters, weight_cast_parameters
    from marssim.parallel.partition import op_rules, shard_loops

    rules = op_rules(graph, parallel)
    per_layer, _ = rank_parameters(graph, parallel, rules)
    share = parallel.dp if parallel.zero >= 1 else 1
    low_params = low_precision_rank_parameters(graph, parallel, rules)
    cfg = transformer_of(graph)
    param_gather = cfg is not None and cfg.fp8_param_gather
    out = []
    for op in graph.ops:
        if op.kind == OpKind.INPUT or rules[op.name].alias:
            continue
        if op.kind == OpKind.RESHAPE and op.param("what") == "grad_buffer":  # a view the optimizer reads
            continue
        sizes = shard_loops(op, rules[op.name], per_layer, share)
        if op.param("weights") and op.param("phase") == "opt":  # the weight cast after the step
            sizes = {"C": max(1, weight_cast_parameters(low_params.get(op.param("layer"), 0), parallel, param_gather))}
        out.append((op, op.with_loops(**sizes) if sizes else op))
    return out


def op_hints(graph: Graph, op: Op, tp: int = 1) -> tuple[tuple[str, int], ...]:
    """What a kernel needs to know about ``op`` beyond its shapes (:attr:`GridPoint.hints`):
    ``rows`` (the softmax row length a softmax gradient reduces over), ``head_dim`` (rotary
    embeddings rotate pairs within each head), ``vocab`` (the table rows an embedding gradient
    scatters into: a rank's part of the vocabulary-parallel token table), ``top_k`` (the experts
    an MoE router keeps per token)."""
    fn = op.param("fn")
    cfg = transformer_of(graph)
    if fn == "softmax_grad":
        src = graph.ops[graph.index[op.inputs[0]]]
        if src.kind == OpKind.SOFTMAX:
            return (("rows", src.dim("L")),)
    if fn in ("rope", "rope_grad") and cfg is not None:
        return (("head_dim", cfg.d_head),)
    if fn == "router" and cfg is not None:
        return (("top_k", cfg.top_k),)
    if fn == "embedding_grad" and op.name.endswith(".grad"):
        table = graph.index.get(op.name[: -len(".grad")])
        if table is not None and graph.ops[table].kind == OpKind.EMBEDDING:
            vocab = int(graph.ops[table].param("vocab", 1))
            if op.name.endswith("embed.tokens.grad") and tp > 1:  # vocabulary-parallel: a 1/tp part of the rows
                vocab = -(-vocab // tp)
            return (("vocab", vocab),)
    return ()


def _with_backend(op: Op, backend: str) -> Op:
    params = dict(op.params)
    params["backend"] = backend
    return replace(op, params=tuple(sorted(params.items())))


def llm_grid(options: LlmGridOptions = LlmGridOptions(), kinds: Sequence[str] = LLM_KINDS) -> tuple[GridPoint, ...]:
    """The grid of ``options`` (see the module docstring): per measure kind (in the order of
    ``kinds``), the distinct shards of every run, first seen first. Pure and deterministic."""
    from marssim.workload import load_workload

    for kind in kinds:
        if kind not in LLM_KINDS:
            raise ValueError(f"unknown kind {kind!r} for the LLM grid; expected some of {', '.join(LLM_KINDS)}")
    for backend in options.backends:
        from marssim.cost.features import SDPA_BACKENDS

        if backend not in SDPA_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; expected some of {', '.join(SDPA_BACKENDS)}")
    by_kind: dict[str, list[GridPoint]] = {k: [] for k in kinds}
    seen: set[tuple] = set()
    graphs: dict[str, Graph] = {}
    for run in llm_runs(options):
        graph = graphs.get(run.spec)
        if graph is None:
            graph = graphs[run.spec] = load_workload(_join(run.spec, f"layers={options.layers}"))
        for op, shard in tp_shards(graph, run.parallel):
            if shard.kind == OpKind.RESHAPE:
                continue
            hints = op_hints(graph, op, run.parallel.tp)
            variants = [_with_backend(shard, b) for b in options.backends] if op.param("fused") else [shard]
            for variant in variants:
                for kind in kinds:
                    p = _point(variant, kind, f"{run.spec}:{op.name} {run.label}", hints)
                    if p is None:
                        continue
                    key = (kind, p.key)
                    if key not in seen:
                        seen.add(key)
                        by_kind[kind].append(p)
    return tuple(p for kind in kinds for p in by_kind[kind])

"""Published kernel measurements as rows of the calibration tables: Vidur's per-operator profiles.

Vidur (Agrawal et al., MLSys 2024; ``github.com/microsoft/vidur``, MIT license) publishes, under
``data/profiling/compute/<gpu>/<model>/mlp.csv``, the GPU time of every non-attention operator of
one transformer layer of eight serving models (Llama 2 7B and 70B, Llama 3 8B and 70B, CodeLlama
34B, InternLM 20B, Qwen 72B, Phi-2) at 1 to 4,096 tokens (32,768 for Llama 3) and tensor
parallel degrees 1, 2, 4 and 8, on A100 and H100 GPUs. How it was measured
(``vidur/profiling/mlp/``): the layers of the ``sarathi-serve`` engine (its ``vidur`` branch;
``nn.Linear`` GEMMs through cuBLAS, its fused RMSNorm, SiLU-and-multiply and rotary kernels) in
``fp16`` under ``torch.inference_mode``, two warm-up steps, then 20 steps traced by
``torch.profiler`` (Kineto): a row's time is the sum of the CUDA kernels one operator launched
(host launch gaps excluded), its statistics over the 20 steps (21 for the embedding, which
runs once more) in milliseconds; L2 is not flushed between steps. The profiles do not name the
GPU variant (A100 SXM4 or PCIe; H100 SXM5 or NVL), the driver, CUDA or library versions.

Every row becomes a table row of the calibration schema (:mod:`marssim.cost.calibrated`) with
the shape the simulator asks for -- :func:`vidur_rows` builds the same layer in marssim
(:func:`marssim.workload.load_workload`, a ``llama`` spec with the profile's dimensions, a
prefill of the row's token count) and cuts it for the row's tensor-parallel degree as the
parallel lowering does (:func:`marssim.calibrate.llm.tp_shards`), so a measured row is found by
exactly the key the cost model looks that shard up by. How each Vidur operator maps:

====================  ==========================  ===================================================
Vidur operator        marssim op (shard)           mapping
====================  ==========================  ===================================================
emb                   ``embed.tokens``             exact (vocabulary-parallel lookup and its masking)
input_layernorm       ``layers.i.input_norm``      exact
post_attention_       ``layers.i.post_norm``       exact
layernorm
attn_pre_proj         ``layers.i.attn.qkv``        exact (one fused Q, K, V projection in both)
attn_rope             ``attn.q_rope`` +            combined: one kernel rotates queries and keys; the
                      ``attn.k_rope``              row carries the sum of the two ops' FLOPs and
                                                   bytes, a shape no marssim op asks for (it trains
                                                   the elementwise curve); partial rotary (Phi-2):
                                                   not mapped
attn_post_proj        ``layers.i.attn.proj``       exact
mlp_up_proj           ``layers.i.mlp.fc1``         exact (GeLU MLPs' fc1; gated MLPs' gate and up
                                                   projections in one GEMM of ``2 x ffn / tp``
                                                   columns in both)
mlp_act               ``layers.i.mlp.act``         exact (SwiGLU: SiLU-and-multiply; GeLU)
mlp_down_proj         ``mlp.down`` (``mlp.fc2``)    exact
add                   ``layers.i.mlp.residual``    exact where the block has a post-attention norm;
                                                   Phi-2's parallel block adds three tensors at
                                                   once: not mapped
====================  ==========================  ===================================================

The attention core (Vidur's ``attention.csv``, FlashAttention prefill and decode) is not read
here. Per-row provenance in the ``note`` (source, commit, file, license, model, ``tp``, token
count, the Vidur operator, the marssim ops, the published standard deviation), the software
stack in ``stack`` (:data:`VIDUR_STACK`); ``spread_s`` is 0 because Vidur publishes min, max,
mean, median and standard deviation, not quartiles (``std_s`` in the note); ``driver`` and
``cuda`` are ``unknown``. A shape measured more than once (the same norm at every ``tp``, the
same GEMM in two models, a token count profiled twice) is kept once: the first measurement in
the order files, ``tp``, tokens, operators (:attr:`VidurImport.repeats` keeps the others'
ratios to it: the profiles' own repeatability).

Which token counts: :func:`default_tokens` (powers of two and three times powers of two: 21 of
the 259 counts, 27 of 451 for Llama 3) unless asked for all; the tables stay small enough to
load in a tenth of a second while every decade of tokens is covered.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from marssim.cost.calibrated import KernelTiming, shape_key
from marssim.errors import InputError

from .table import format_note

__all__ = ["VIDUR_SOURCE", "VIDUR_LICENSE", "VIDUR_STACK", "VIDUR_GPUS", "VidurGpu", "Provenance", "VidurImport",
           "VIDUR_OPS", "VIDUR_MODEL_TRAITS", "default_tokens", "vidur_spec", "vidur_rows", "parse_vidur_csv",
           "import_summary", "vidur_files", "shape_of"]

VIDUR_SOURCE = "microsoft/vidur"
VIDUR_LICENSE = "MIT"
VIDUR_STACK = "vidur-2024"
"""The software stack of Vidur's profiles: ``sarathi-serve`` (its ``vidur`` branch) on PyTorch,
``fp16``, kernel times from ``torch.profiler``; data committed in May and July 2024."""


@dataclass(frozen=True)
class VidurGpu:
    """A GPU directory of Vidur's profiles: the table's device name, its SM count, and what the
    source says (or does not say) about the variant."""

    device: str
    sms: int
    variant: str


VIDUR_GPUS = {
    "a100": VidurGpu("A100", 108, "NVIDIA A100 80GB (SXM4 or PCIe not stated; 108 SMs either way)"),
    "h100": VidurGpu("H100", 132, "NVIDIA H100 80GB (variant not stated; 132 SMs of the SXM5 and NVL parts, "
                                  "as Vidur's h100_dgx network profiles suggest)"),
}
"""Vidur's GPU directory names and what the rows say about them."""

VIDUR_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
"""The operators of ``mlp.csv`` (columns ``time_stats.<op>.<statistic>``), in layer order."""

VIDUR_MODEL_TRAITS = {
    "microsoft/phi-2": {"norm": "layer", "partial_rotary": True},
}
"""What ``mlp.csv`` does not say about a model but its mapping needs (``vidur/config/model_config.py``
at the imported commit): Phi-2 uses LayerNorm and rotates 40 % of each head (``partial_rotary_factor
0.4``). Every other model there is Llama-like: RMSNorm, full rotary embeddings. Whether a block has
a post-attention norm (else Phi-2's parallel attention and MLP) is read from the profile itself
(a ``post_attention_layernorm`` column)."""


@dataclass(frozen=True)
class Provenance:
    """Where a published file comes from: ``source`` (``owner/repo``), ``commit``, ``file`` (its
    path there), ``license``, and ``date`` (ISO: the date of the commit that last changed the
    file -- the measurement date is not published -- written as the rows' ``date``)."""

    source: str
    commit: str
    file: str
    license: str
    date: str

    def fields(self) -> dict[str, str]:
        return {"source": self.source, "commit": self.commit, "file": self.file, "license": self.license}


@dataclass
class VidurImport:
    """What :func:`vidur_rows` made of a profile: the table ``rows``; per Vidur operator and
    mapping, how many rows (``mapped``: ``(op, how) -> rows``, ``how`` one of ``exact``,
    ``combined``); what could not be mapped (``unmapped``: ``(op, model,
    reason) -> rows``); the measurements of shapes already kept (``repeats``: their median over the
    kept row's, by Vidur operator)."""

    rows: list[KernelTiming] = field(default_factory=list)
    mapped: dict[tuple[str, str], int] = field(default_factory=dict)
    unmapped: dict[tuple[str, str, str], int] = field(default_factory=dict)
    repeats: dict[str, list[float]] = field(default_factory=dict)
    seen: dict[tuple, int] = field(default_factory=dict)

    def merge(self, other: "VidurImport") -> None:
        """Add ``other``'s rows after these (shapes kept here win: the first measurement)."""
        for r in other.rows:
            self._add(r, r.kernel.removeprefix("vidur:"), None)
        for k, v in other.mapped.items():
            self.mapped[k] = self.mapped.get(k, 0) + v
        for k, v in other.unmapped.items():
            self.unmapped[k] = self.unmapped.get(k, 0) + v
        for k, v in other.repeats.items():
            self.repeats.setdefault(k, []).extend(v)

    def _add(self, row: KernelTiming, op: str, how: str | None) -> None:
        key = (row.device, row.stack, row.shape)
        first = self.seen.get(key)
        if first is not None:
            self.repeats.setdefault(op, []).append(row.median_s / self.rows[first].median_s)
            return
        self.seen[key] = len(self.rows)
        self.rows.append(row)
        if how is not None:
            self.mapped[(op, how)] = self.mapped.get((op, how), 0) + 1


def default_tokens(n: int) -> bool:
    """The token counts imported by default: powers of two and three times powers of two."""
    return n >= 1 and (n & (n - 1) == 0 or (n % 3 == 0 and (n // 3) & (n // 3 - 1) == 0))


def vidur_spec(model: str, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, gated: bool,
               tokens: int) -> str:
    """The marssim workload spec of one block of a Vidur model in a prefill of ``tokens``
    tokens (``fp16``, as profiled): a ``llama`` spec with the profile's dimensions."""
    traits = VIDUR_MODEL_TRAITS.get(model, {})
    params = [f"hidden={hidden}", f"heads={heads}", f"kv_heads={kv_heads}", f"ffn={ffn}", f"vocab={vocab}",
              "layers=1", "mode=prefill", f"seq={tokens}", "batch=1", "dtype=fp16"]
    if not gated:
        params.append("activation=gelu")
    if traits.get("norm") == "layer":
        params.append("norm=layer")
    return "llama:" + ",".join(params)


def parse_vidur_csv(text: str, name: str) -> tuple[list[str], list[dict[str, str]]]:
    """The Vidur operators and rows of an ``mlp.csv`` (an InputError naming ``name`` when the
    columns are not Vidur's)."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    need = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
            "num_tensor_parallel_workers")
    missing = [c for c in need if c not in header]
    if missing:
        raise InputError(name, "header", f"expected Vidur's mlp.csv columns; missing {', '.join(missing)}")
    ops = [op for op in VIDUR_OPS if f"time_stats.{op}.median" in header]
    if not ops:
        raise InputError(name, "header", f"expected time_stats.<op>.median columns for some of {', '.join(VIDUR_OPS)}")
    return ops, list(reader)


def _int(row: dict[str, str], col: str, name: str, line: int) -> int:
    try:
        return int(float(row[col]))
    except (TypeError, ValueError):
        raise InputError(name, f"line {line}: {col}", f"expected an integer, got {row[col]!r}") from None


def _stat(row: dict[str, str], op: str, stat: str) -> float | None:
    text = (row.get(f"time_stats.{op}.{stat}") or "").strip()
    if not text:
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def vidur_rows(text: str, provenance: Provenance, gpu: str, model: str,
               tokens: Callable[[int], bool] | None = default_tokens) -> VidurImport:
    """The calibration rows of one Vidur ``mlp.csv`` (its text; ``model`` the Hugging Face name
    of its directory, e.g. ``meta-llama/Meta-Llama-3-8B``; ``gpu`` a key of :data:`VIDUR_GPUS`),
    for the token counts ``tokens`` accepts (None: all). See the module docstring for the
    mapping. Deterministic; InputError on a file that is not Vidur's."""
    from marssim.calibrate.grid import _point
    from marssim.calibrate.llm import tp_shards
    from marssim.parallel.config import ParallelConfig
    from marssim.workload import load_workload

    if gpu not in VIDUR_GPUS:
        raise InputError(provenance.file, "gpu", f"expected one of {', '.join(VIDUR_GPUS)}, got {gpu!r}")
    device = VIDUR_GPUS[gpu]
    ops, raw = parse_vidur_csv(text, provenance.file)
    parallel_block = "post_attention_layernorm" not in ops
    partial_rotary = bool(VIDUR_MODEL_TRAITS.get(model, {}).get("partial_rotary"))
    out = VidurImport()
    by_run: dict[tuple[int, int], tuple[int, dict[str, str]]] = {}
    for line, row in enumerate(raw, start=2):
        n = _int(row, "num_tokens", provenance.file, line)
        tp = _int(row, "num_tensor_parallel_workers", provenance.file, line)
        if tokens is not None and not tokens(n):
            continue
        if (tp, n) in by_run:  # a token count profiled twice: the first one is kept
            for op in ops:
                first, again = _stat(by_run[(tp, n)][1], op, "median"), _stat(row, op, "median")
                if first and again:
                    out.repeats.setdefault(op, []).append(again / first)
            continue
        by_run[(tp, n)] = (line, row)
    graphs: dict[int, object] = {}
    for (tp, n), (line, row) in sorted(by_run.items()):
        dims = {c: _int(row, c, provenance.file, line) for c in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd",
                                                                   "vocab_size")}
        gated = (row.get("use_gated_mlp") or "").strip().lower() == "true"
        graph = graphs.get(n)
        if graph is None:
            spec = vidur_spec(model, dims["n_embd"], dims["n_head"], dims["n_kv_head"], dims["n_expanded_embd"],
                              dims["vocab_size"], gated, n)
            graph = graphs[n] = load_workload(spec)
        shards = {op.name: shard for op, shard in tp_shards(graph, ParallelConfig(tp=tp, micro_batch=1))}
        points = {}
        for name_, shard in shards.items():
            for kind in ("gemm", "elementwise", "norm", "embedding"):
                p = _point(shard, kind, name_)
                if p is not None:
                    points[name_] = p
        for op in ops:
            median = _stat(row, op, "median")
            if median is None or median <= 0:
                continue
            found = _map(op, points, gated, parallel_block, partial_rotary)
            if isinstance(found, str):
                key = (op, model, found)
                out.unmapped[key] = out.unmapped.get(key, 0) + 1
                continue
            kind, batch, m, n_, k, flops, nbytes, how, names = found
            std = _stat(row, op, "std")
            note = format_note({**provenance.fields(), "model": model, "tp": tp, "num_tokens": n, "op": op,
                                "marssim_op": "+".join(names) if names else "-", "mapping": how,
                                "gpu": device.variant.replace(";", ","), "std_s": f"{std * 1e-3:.4g}" if std else "",
                                "timing": "torch.profiler kernel time, median of 20 steps, L2 warm"})
            r = KernelTiming(kind, "fp16", batch, m, n_, k, float(flops), float(nbytes), device.device, device.sms,
                             "unknown", "unknown", "vendor", median * 1e-3, 0.0, 21 if op == "emb" else 20,
                             provenance.date, f"vidur:{op}", note, "", "fwd", "", None, VIDUR_STACK)
            out._add(r, op, how)
    return out


_PREFIX = "layers.0."


def _map(op: str, points: dict, gated: bool, parallel_block: bool, partial_rotary: bool):
    """``(kind, batch, m, n, k, flops, bytes, how, marssim op names)`` of Vidur operator ``op``
    from the shard points of the layer, or the reason it is not mapped."""
    def exact(name: str):
        p = points.get(name)
        if p is None:
            return f"no {name} in the marssim layer"
        return p.kind, p.batch, p.m, p.n, p.k, p.flops, p.bytes, "exact", (name,)

    if op == "emb":
        return exact("embed.tokens")
    if op == "input_layernorm":
        return exact(_PREFIX + "input_norm")
    if op == "post_attention_layernorm":
        return exact(_PREFIX + "post_norm")
    if op == "attn_pre_proj":
        return exact(_PREFIX + "attn.qkv")
    if op == "attn_post_proj":
        return exact(_PREFIX + "attn.proj")
    if op == "mlp_act":
        return exact(_PREFIX + "mlp.act")
    if op == "mlp_down_proj":
        return exact(_PREFIX + ("mlp.down" if gated else "mlp.fc2"))
    if op == "mlp_up_proj":  # GeLU's fc1, or a gated MLP's gate and up in one GEMM: marssim's mlp.fc1 both
        return exact(_PREFIX + "mlp.fc1")
    if op == "attn_rope":
        if partial_rotary:
            return "partial rotary embedding (a part of each head): no marssim op rotates part of a head"
        q, k = points.get(_PREFIX + "attn.q_rope"), points.get(_PREFIX + "attn.k_rope")
        if q is None or k is None:
            return "no rotary embedding in the marssim layer"
        return "elementwise", 0, 0, 0, 0, q.flops + k.flops, q.bytes + k.bytes, "combined", \
            (_PREFIX + "attn.q_rope", _PREFIX + "attn.k_rope")
    if op == "add":
        if parallel_block:
            return "three-way residual add of a parallel attention and MLP block: no marssim op"
        return exact(_PREFIX + "mlp.residual")
    return f"unknown operator {op!r}"


def shape_of(row: KernelTiming) -> tuple:
    """The :func:`~marssim.cost.calibrated.shape_key` of a row (convenience for reports)."""
    return shape_key(row.kind, row.dtype, row.batch, row.m, row.n, row.k, row.flops, row.bytes, row.conv, row.phase,
                     row.backend)


def import_summary(result: VidurImport, files: Sequence[str] = ()) -> list[str]:
    """Lines saying what an import kept, mapped, left out and how repeatable the repeats were."""
    from statistics import median

    lines = [f"{len(result.rows)} rows" + (f" from {len(files)} files" if files else "")]
    for (op, how), n in sorted(result.mapped.items()):
        lines.append(f"  {op:26s} {how:20s} {n:6d} rows")
    for (op, model, reason), n in sorted(result.unmapped.items()):
        lines.append(f"  not mapped: {op} of {model} ({n} rows): {reason}")
    for op, ratios in sorted(result.repeats.items()):
        dev = sorted(abs(r - 1.0) for r in ratios)
        lines.append(f"  repeated shapes of {op}: {len(ratios)}, median |t / t_kept - 1| = {100 * median(dev):.1f} %, "
                     f"p90 {100 * dev[int(0.9 * (len(dev) - 1))]:.1f} %")
    return lines


def vidur_files(paths: Iterable[str]) -> list[tuple[str, str, str]]:
    """``(gpu, model, path)`` of Vidur ``mlp.csv`` paths (``.../compute/<gpu>/<org>/<model>/mlp.csv``),
    sorted; paths of other shapes are left out."""
    out = []
    for path in paths:
        parts = path.replace("\\", "/").split("/")
        if len(parts) >= 4 and parts[-1] == "mlp.csv" and parts[-4] in VIDUR_GPUS:
            out.append((parts[-4], f"{parts[-3]}/{parts[-2]}", path))
    return sorted(out)

"""A serving deployment as a value: pools of model replicas, each replica's parallelism, GPU kind,
engine scheduler and KV cache, and the router in front of them. Immutable and hashable, so a
search can cache evaluations by it.

============================  ===================================================================
pool setting                  meaning (the engines' own names where they have one)
============================  ===================================================================
``role``                      ``both`` (a replica prefills and decodes), ``prefill`` or ``decode``
                              (disaggregated pools: the KV cache of a prefilled request moves to a
                              decode replica over the network)
``replicas``                  replicas in the pool
``tp``, ``pp``                tensor and pipeline parallelism of each replica (``tp x pp`` GPUs)
``ep``                        expert parallelism of a mixture-of-experts model: 1 (every GPU holds
                              every expert, split over tp) or tp (whole experts over the tp GPUs,
                              vLLM's ``--enable-expert-parallel``); see :mod:`.itermodel`
``gpu``                       the GPU design a replica runs on (a design name of the system, for
                              a cluster of several GPU kinds); default: the next free GPUs
``scheduler``                 ``static`` (a batch runs to its last request, then the next batch
                              forms; the KV cache of prompt + output reserved up front),
                              ``continuous`` (vLLM's default: iteration-level batching, waiting
                              prompts prefilled first, in iterations of their own; with
                              ``mixed=true`` they join the running decodes, as Orca), ``chunked``
                              (Sarathi-Serve, vLLM's chunked prefill: every iteration the running
                              decodes, then prompt chunks up to the token budget)
``max_num_seqs``              sequences an iteration may hold (vLLM ``--max-num-seqs``, 256)
``scheduler_steps``           decode steps scheduled at once (vLLM's multi-step scheduling,
                              ``--num-scheduler-steps``; 1, the default: every step scheduled):
                              a decode-only iteration opens a block of this many, and requests
                              that arrive meanwhile wait for its end; ``scheduler=continuous``
                              without ``mixed`` and without speculative decoding
``max_batched_tokens``        tokens an iteration may hold (``--max-num-batched-tokens``; the
                              chunk budget of ``chunked``; a longer prompt than this is rejected
                              by ``continuous`` and ``static``); default 8192
``block_size``                tokens per KV-cache block (``--block-size``, 16)
``watermark``                 fraction of blocks a new prompt must leave free (0.01)
``gpu_memory_utilization``    fraction of a GPU's memory the engine may use (0.9)
``kv_cache_free_gpu_mem_fraction``  TensorRT-LLM's rule instead (``kv_cache_free_gpu_mem_fraction``
                              of ``trtllm-bench``, ``KvCacheConfig.free_gpu_memory_fraction``):
                              the KV cache takes this fraction of the memory left free after
                              the weights and the activation workspace (0: unset, the
                              ``gpu_memory_utilization`` rule); not given with
                              ``gpu_memory_utilization``
``capacity``                  ``max_utilization`` (default: admit a prompt when its blocks are
                              free, preempt when decodes run out) or ``guaranteed_no_evict``
                              (TensorRT-LLM's default ``CapacitySchedulerPolicy``: admit a request
                              only when its prompt and whole output fit beside the running ones';
                              no preemption)
``preemption``                ``recompute`` (vLLM's default: a preempted sequence's blocks are
                              freed, its tokens prefilled again) or ``swap`` (to host memory)
``swap_space``                host memory per GPU for swapped blocks (``--swap-space``, 4 GiB), with
                              its unit; given only with ``preemption=swap``
``prefix_caching``            keep the full blocks of shared prompt prefixes (``--enable-prefix-caching``)
``spec_method``               speculative decoding (:mod:`.speculative`): ``none`` (default),
                              ``draft`` (a smaller LLM proposes tokens) or ``mtp`` (MTP/EAGLE-style
                              draft heads of the model's width)
``spec_model``                the draft model (``spec_method=draft``): a model spec, same vocabulary
``spec_layers``               blocks of one draft head pass (``spec_method=mtp``; 1)
``spec_k``                    tokens proposed per step (vLLM ``num_speculative_tokens``)
``spec_alpha``                probability that a proposed token is accepted (each, independently)
``engine``                    whose host time an iteration pays (:mod:`.hosttime`): ``none``
                              (default: the GPU's time alone), ``vllm``, ``sglang``, ``trtllm``
                              (scheduling, inputs, sampling and output processing on the host,
                              the kernels' launches; overlapped with the GPU as the engine does)
``cuda_graphs``               decode iterations of a captured batch size replay one CUDA graph
                              (``true``, default; the engine's capture sizes) or launch every
                              kernel (``false``, vLLM ``--enforce-eager``); given with an engine
``fused_elementwise``         the engine runs a block's residual adds, FP8 quantizations and
                              rotary embeddings inside its norm, activation and attention kernels
                              (``true``: TensorRT-LLM's Llama block; default ``false``: every op
                              its own kernel); see :mod:`.itermodel`
``host_overlap``              ``auto`` (default: the engine's own, every shipped engine overlaps),
                              ``true`` or ``false`` (vLLM ``--no-async-scheduling``, SGLang
                              ``--disable-overlap-schedule``, TensorRT-LLM
                              ``disable_overlap_scheduler``); given with an engine
============================  ===================================================================

Deployment settings: ``router`` (``round_robin``, ``least_tokens``: the replica with the fewest
outstanding prompt and output tokens, ``least_requests``, ``random``), ``decode_router`` (for
disaggregated pools, where a prefilled request goes; default ``least_tokens``),
``context_bucket`` (decode attention timed at the batch's mean context rounded to this many
tokens; 1 is exact, see :mod:`.itermodel`), ``tp_comm`` (``closed``: an iteration's
tensor-parallel collectives timed on their routes without contention; ``network``: as flows of
the network, so KV moves and pipeline transfers on the same links slow them).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from marssim.errors import InputError
from marssim.specs import parse_items

__all__ = ["SchedulerConfig", "Pool", "Deployment", "SCHEDULERS", "ROUTERS", "ROLES", "parse_pool",
           "deployment_from_dict", "deployment_to_dict", "pool_to_dict"]

SCHEDULERS = ("static", "continuous", "chunked")
ROUTERS = ("round_robin", "least_tokens", "least_requests", "random")
ROLES = ("both", "prefill", "decode")
TP_COMM = ("closed", "network")
PREEMPTION = ("recompute", "swap")
CAPACITY_POLICIES = ("max_utilization", "guaranteed_no_evict")
"""How a scheduler admits requests against its KV cache (:mod:`.schedulers`)."""
SPEC_METHODS = ("none", "draft", "mtp")
HOST_ENGINES = ("none", "vllm", "sglang", "trtllm")
HOST_OVERLAP = ("auto", "true", "false")


def bytes_text(n: float) -> str:
    """``n`` bytes as a person writes them and the parser reads them back to the same number:
    ``16 GiB``, else the exact count (``4294967297 B``)."""
    from marssim import units

    text = units.fmt_bytes(n)
    if units.parse(text, "bytes", allow_zero=True) == n:
        return text
    return f"{int(n)} B" if float(n).is_integer() else f"{n!r} B"


@dataclass(frozen=True)
class SchedulerConfig:
    """One replica's engine: its batching policy and KV cache (see the module docstring)."""

    kind: str = "continuous"
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    scheduler_steps: int = 1
    mixed: bool = False
    block_size: int = 16
    watermark: float = 0.01
    gpu_memory_utilization: float = 0.9
    kv_cache_free_gpu_mem_fraction: float = 0.0  # 0: unset (the gpu_memory_utilization rule)
    preemption: str = "recompute"
    capacity: str = "max_utilization"
    swap_space: float = 4 * 2**30  # bytes per GPU
    prefix_caching: bool = False
    spec_method: str = "none"
    spec_model: str = ""
    spec_layers: int = 1
    spec_k: int = 0
    spec_alpha: float = -1.0  # unset
    engine: str = "none"
    cuda_graphs: bool = True
    host_overlap: str = "auto"
    fused_elementwise: bool = False

    @property
    def overlap(self) -> bool | None:
        """Whether the engine's host work overlaps the GPU's (None: the engine's own)."""
        return None if self.host_overlap == "auto" else self.host_overlap == "true"

    @property
    def speculative(self) -> bool:
        """Whether the engine decodes speculatively (``spec_method`` other than ``none``)."""
        return self.spec_method != "none"

    @property
    def lookahead(self) -> int:
        """Tokens a decoding sequence writes to the KV cache beyond its next one in a step (the
        proposed tokens verified with it): ``spec_k``, or 0 without speculation."""
        return self.spec_k if self.spec_method != "none" else 0


@dataclass(frozen=True)
class Pool:
    """``replicas`` replicas of ``tp x pp`` GPUs of kind ``gpu`` in role ``role``."""

    replicas: int = 1
    tp: int = 1
    pp: int = 1
    role: str = "both"
    gpu: str = ""
    scheduler: SchedulerConfig = SchedulerConfig()
    ep: int = 1

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    def text(self) -> str:
        """The pool as a ``--pool`` string (settings that differ from the defaults)."""
        parts = [f"replicas={self.replicas}", f"tp={self.tp}"]
        if self.pp != 1:
            parts.append(f"pp={self.pp}")
        if self.ep != 1:
            parts.append(f"ep={self.ep}")
        if self.role != "both":
            parts.append(f"role={self.role}")
        if self.gpu:
            parts.append(f"gpu={self.gpu}")
        default = SchedulerConfig()
        for f in fields(SchedulerConfig):
            value = getattr(self.scheduler, f.name)
            if value != getattr(default, f.name):
                key = "scheduler" if f.name == "kind" else f.name
                if f.name == "swap_space":
                    value = bytes_text(value).replace(" ", "")
                parts.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
        return ",".join(parts)


@dataclass(frozen=True)
class Deployment:
    """Pools of replicas behind a router (see the module docstring). Immutable, hashable."""

    pools: tuple[Pool, ...]
    router: str = "least_tokens"
    decode_router: str = "least_tokens"
    context_bucket: int = 1
    tp_comm: str = "closed"

    @property
    def disaggregated(self) -> bool:
        return any(p.role != "both" for p in self.pools)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def replicas(self) -> int:
        return sum(p.replicas for p in self.pools)

    def text(self) -> str:
        out = " + ".join(p.text() for p in self.pools) + f"; router {self.router}"
        if self.disaggregated:
            out += f", decode router {self.decode_router}"
        if self.context_bucket != 1:
            out += f", context bucket {self.context_bucket}"
        if self.tp_comm != "closed":
            out += f", tensor-parallel collectives on the {self.tp_comm}"
        return out

    def with_(self, **changes: Any) -> "Deployment":
        return replace(self, **changes)


# ---------------------------------------------------------------------- checking and parsing
_POOL_INT = ("replicas", "tp", "pp", "ep")
_SCHED_INT = ("max_num_seqs", "max_batched_tokens", "block_size", "scheduler_steps")
_SCHED_FLOAT = ("watermark", "gpu_memory_utilization", "kv_cache_free_gpu_mem_fraction")
_SCHED_BOOL = ("mixed", "prefix_caching", "cuda_graphs", "fused_elementwise")
_SPEC_KEYS = ("spec_method", "spec_model", "spec_layers", "spec_k", "spec_alpha")
POOL_KEYS = ("role", "replicas", "tp", "pp", "ep", "gpu", "scheduler") + _SCHED_INT + _SCHED_FLOAT + _SCHED_BOOL + \
    ("preemption", "capacity", "swap_space") + _SPEC_KEYS + ("engine", "host_overlap")


def _int(value: Any, where: str, key: str, low: int = 1, high: int = 1 << 30) -> int:
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise InputError(where, key, f"expected an integer, got {value!r}")
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise InputError(where, key, f"expected an integer, got {value!r}") from None
    if not low <= number <= high:
        raise InputError(where, key, f"expected an integer from {low} to {high:,}, got {number}")
    return number


def _float(value: Any, where: str, key: str, low: float, high: float) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        number = float("nan")
    if not low <= number <= high:
        raise InputError(where, key, f"expected a number from {low:g} to {high:g}, got {value!r}")
    return number


def _bool(value: Any, where: str, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise InputError(where, key, f"expected true or false, got {value!r}")


def _choice(value: Any, where: str, key: str, allowed: tuple[str, ...]) -> str:
    text = str(value).strip()
    if text not in allowed:
        raise InputError(where, key, f"expected one of {', '.join(allowed)}, got {value!r}")
    return text


def pool_from_dict(data: dict, where: str, prefix: str = "") -> Pool:
    """A :class:`Pool` from its settings (flat: pool and scheduler keys together); InputError
    naming ``prefix`` + the key of the first bad one."""
    if not isinstance(data, dict):
        raise InputError(where, prefix.rstrip("."), f"expected a mapping of pool settings, got {data!r}")
    pool: dict[str, Any] = {}
    sched: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key)
        path = prefix + key
        if key not in POOL_KEYS:
            raise InputError(where, path, f"unknown pool setting; expected one of: {', '.join(POOL_KEYS)}")
        if key in _POOL_INT:
            pool[key] = _int(value, where, path, 1, 4096)
        elif key == "role":
            pool[key] = _choice(value, where, path, ROLES)
        elif key == "gpu":
            pool[key] = str(value).strip()
        elif key == "scheduler":
            sched["kind"] = _choice(value, where, path, SCHEDULERS)
        elif key == "max_num_seqs":
            sched[key] = _int(value, where, path, 1, 65536)
        elif key == "max_batched_tokens":
            sched[key] = _int(value, where, path, 1, 1 << 24)
        elif key == "block_size":
            sched[key] = _int(value, where, path, 1, 4096)
        elif key == "scheduler_steps":
            sched[key] = _int(value, where, path, 1, 64)
        elif key == "watermark":
            sched[key] = _float(value, where, path, 0.0, 0.5)
        elif key == "gpu_memory_utilization":
            sched[key] = _float(value, where, path, 0.01, 1.0)
        elif key == "kv_cache_free_gpu_mem_fraction":
            if "gpu_memory_utilization" in data:
                raise InputError(where, path, "expected one memory rule: kv_cache_free_gpu_mem_fraction (TensorRT-"
                                              "LLM's share of the free memory) or gpu_memory_utilization, not both")
            sched[key] = _float(value, where, path, 0.01, 1.0)
        elif key in _SCHED_BOOL:
            sched[key] = _bool(value, where, path)
        elif key == "preemption":
            sched[key] = _choice(value, where, path, PREEMPTION)
        elif key == "capacity":
            sched[key] = _choice(value, where, path, CAPACITY_POLICIES)
        elif key == "swap_space":
            from marssim import units

            try:
                sched[key] = units.parse(value, "bytes", allow_zero=True, require_unit=True, bounded=True)
            except units.UnitError as err:
                raise InputError(where, path, str(err)) from None
        elif key == "spec_method":
            sched[key] = _choice(value, where, path, SPEC_METHODS)
        elif key == "engine":
            sched[key] = _choice(value, where, path, HOST_ENGINES)
        elif key == "host_overlap":
            sched[key] = _choice(str(value).lower() if isinstance(value, bool) else value, where, path, HOST_OVERLAP)
        elif key == "spec_model":
            sched[key] = str(value).strip()
        elif key == "spec_layers":
            sched[key] = _int(value, where, path, 1, 16)
        elif key == "spec_k":
            sched[key] = _int(value, where, path, 1, 32)
        elif key == "spec_alpha":
            sched[key] = _float(value, where, path, 0.0, 1.0)
    cfg = SchedulerConfig(**sched)
    if "swap_space" in sched and cfg.preemption != "swap":
        raise InputError(where, prefix + "swap_space", f"applies to preemption=swap (host memory for swapped "
                                                       f"blocks), got preemption={cfg.preemption}, which swaps nothing")
    for key in ("cuda_graphs", "host_overlap"):
        if key in sched and cfg.engine == "none":
            raise InputError(where, prefix + key, "applies with an engine (engine=vllm, sglang or trtllm); "
                                                  "engine=none models no host time")
    if cfg.mixed and cfg.kind != "continuous":
        raise InputError(where, prefix + "mixed", f"applies to scheduler=continuous, got scheduler={cfg.kind}")
    if cfg.scheduler_steps > 1 and (cfg.kind != "continuous" or cfg.mixed or cfg.speculative):
        raise InputError(where, prefix + "scheduler_steps", "multi-step scheduling applies to scheduler=continuous "
                                                           "without mixed=true and without speculative decoding (as "
                                                           "vLLM runs it)")
    out = Pool(scheduler=cfg, **pool)
    _check_spec(out, where, prefix)
    return out


def _check_spec(pool: Pool, where: str, prefix: str) -> None:
    """InputError for speculative-decoding settings that do not fit together (the draft model's
    own fit to the target is checked where the model is known, :mod:`.speculative`)."""
    cfg = pool.scheduler
    given = [k for k in _SPEC_KEYS[1:] if getattr(cfg, k) != getattr(SchedulerConfig(), k)]
    if not cfg.speculative:
        if given:
            raise InputError(where, prefix + given[0], "applies with spec_method=draft or spec_method=mtp")
        return
    if cfg.spec_k < 1:
        raise InputError(where, prefix + "spec_k", f"expected the tokens proposed per step with "
                                                   f"spec_method={cfg.spec_method}, e.g. spec_k=4")
    if "spec_alpha" not in given:
        raise InputError(where, prefix + "spec_alpha", "expected the acceptance probability of a proposed token "
                                                       "(0 to 1), e.g. spec_alpha=0.7")
    if cfg.spec_method == "draft" and not cfg.spec_model:
        raise InputError(where, prefix + "spec_model", "expected the draft model with spec_method=draft, "
                                                       "e.g. spec_model=llama3-8b")
    if cfg.spec_method == "mtp" and cfg.spec_model:
        raise InputError(where, prefix + "spec_model", "applies to spec_method=draft (MTP heads are the "
                                                       "model's own; set spec_layers)")
    if cfg.spec_method == "draft" and cfg.spec_layers != 1:
        raise InputError(where, prefix + "spec_layers", "applies to spec_method=mtp (a draft model has its own layers)")
    if pool.role == "prefill":
        raise InputError(where, prefix + "spec_method", "a prefill pool does not decode; speculative decoding "
                                                        "applies to pools of role both or decode")
    if cfg.kind == "static":
        raise InputError(where, prefix + "spec_method", "speculative decoding runs with scheduler=continuous or "
                                                        "chunked, got scheduler=static")
    if pool.pp > 1:
        raise InputError(where, prefix + "spec_method", f"speculative decoding is modelled for pp=1 replicas, "
                                                        f"got pp={pool.pp}")


def parse_pool(text: str, where: str = "--pool") -> Pool:
    """A :class:`Pool` from ``replicas=16,tp=4,scheduler=chunked,max_batched_tokens=2048``; the
    settings after ``spec_model`` that are not pool keys are the draft model's parameters
    (``spec_model=llama:layers=2,hidden=1024,tp=2``)."""
    def draft_parameter(last: str, item: str) -> bool:  # the draft model's own parameters
        key, eq, _ = item.partition("=")
        return last == "spec_model" and bool(eq) and key.strip() not in POOL_KEYS

    items = parse_items(text, "", file=where, expected="key=value settings like replicas=16,tp=4",
                        continues=draft_parameter).named
    return pool_from_dict(items, where)


def deployment_from_dict(data: dict, where: str) -> Deployment:
    """A :class:`Deployment` from a file's mapping: ``pools`` (a list of pool settings),
    ``router``, ``decode_router``, ``context_bucket``, ``tp_comm``; InputError with the key path."""
    allowed = ("pools", "router", "decode_router", "context_bucket", "tp_comm")
    if not isinstance(data, dict):
        raise InputError(where, "", f"expected a mapping with pools and {', '.join(allowed[1:])}, got {data!r}")
    for key in data:
        if key not in allowed:
            raise InputError(where, str(key), f"unknown deployment setting; expected one of: {', '.join(allowed)}")
    pools_data = data.get("pools")
    if not isinstance(pools_data, list) or not pools_data:
        raise InputError(where, "pools", "expected a list of pools (each with replicas, tp, ...)")
    pools = tuple(pool_from_dict(p, where, f"pools[{i}].") for i, p in enumerate(pools_data))
    out = Deployment(pools,
                     router=_choice(data.get("router", "least_tokens"), where, "router", ROUTERS),
                     decode_router=_choice(data.get("decode_router", "least_tokens"), where, "decode_router",
                                           ROUTERS),
                     context_bucket=_int(data.get("context_bucket", 1), where, "context_bucket", 1, 4096),
                     tp_comm=_choice(data.get("tp_comm", "closed"), where, "tp_comm", TP_COMM))
    check_deployment(out, where)
    return out


def pool_to_dict(pool: Pool) -> dict[str, Any]:
    """A pool's settings as a file holds them (:func:`pool_from_dict` reads them back to the same
    pool): replicas and tp always, the rest where they differ from the defaults."""
    out: dict[str, Any] = {}
    if pool.role != "both":
        out["role"] = pool.role
    out["replicas"] = pool.replicas
    out["tp"] = pool.tp
    if pool.pp != 1:
        out["pp"] = pool.pp
    if pool.ep != 1:
        out["ep"] = pool.ep
    if pool.gpu:
        out["gpu"] = pool.gpu
    default = SchedulerConfig()
    for f in fields(SchedulerConfig):
        value = getattr(pool.scheduler, f.name)
        if value == getattr(default, f.name):
            continue
        if f.name == "swap_space":
            out[f.name] = bytes_text(value)
        else:
            out["scheduler" if f.name == "kind" else f.name] = value
    return out


def deployment_to_dict(dep: Deployment) -> dict[str, Any]:
    """A deployment as a file holds it (:func:`deployment_from_dict` reads it back to the same
    value): its pools, its router, and the settings that differ from the defaults."""
    out: dict[str, Any] = {"router": dep.router}
    if dep.disaggregated or dep.decode_router != "least_tokens":
        out["decode_router"] = dep.decode_router
    if dep.context_bucket != 1:
        out["context_bucket"] = dep.context_bucket
    if dep.tp_comm != "closed":
        out["tp_comm"] = dep.tp_comm
    out["pools"] = [pool_to_dict(p) for p in dep.pools]
    return out


def check_deployment(dep: Deployment, where: str = "deployment") -> None:
    """Raise InputError when the pools cannot serve together: prefill pools without decode pools
    (or the other way round), or both kinds beside a ``both`` pool."""
    for i, pool in enumerate(dep.pools):
        _check_spec(pool, where, f"pools[{i}].")
    roles = {p.role for p in dep.pools}
    if "prefill" in roles and "decode" not in roles or "decode" in roles and "prefill" not in roles:
        raise InputError(where, "pools", "disaggregated serving needs a prefill pool and a decode pool")
    if "both" in roles and len(roles) > 1:
        raise InputError(where, "pools", "a deployment is either pools of role both or prefill and decode pools")

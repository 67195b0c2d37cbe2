"""How each op of a transformer graph is split over a tensor-parallel group (Megatron-LM's
recipe, Shoeybi et al. 2019; sequence parallelism, Korthikanti et al. 2022).

Tensors carry one of four *layouts* over the ``tp`` ranks of a group:

====  ===================================================================================
R     replicated: every rank holds the whole tensor
S     split along the tokens (sequence parallelism)
F     split along the features: attention heads, MLP columns, vocabulary entries
P     partial sums: every rank holds the whole shape, the tensor is their sum
E     routed to experts: the tokens each expert-parallel rank's experts process (MoE)
X     routed tokens gathered over the expert-tensor-parallel group (``etp > 1``)
Y     routed tokens of that group, features split over it
Z     partial sums over that group (a row-parallel expert GEMM's output)
====  ===================================================================================

An op wants a layout for each input and gives one for its output (:class:`Rule`); where the
producer's layout differs, the lowering inserts the collective that converts it:
``P -> R`` all-reduce, ``P -> S`` reduce-scatter, ``S -> R`` all-gather (and the
expert-parallel all-to-all ``S <-> E``); ``R -> S`` and ``R -> F`` are local slices. The rules:

* each GEMM's split is the role the graph builder declared on it
  (:class:`~marssim.workload.llm.tprole.TpRole`, param ``tp_role``; a GEMM of a transformer graph
  without one is refused, naming it: its split would be a guess): column-parallel GEMMs (Q/K/V,
  MLP up/gate/fc1, the output layer over the vocabulary) split their output features:
  ``R -> F``; row-parallel GEMMs (attention output, MLP down/fc2) split their input features:
  ``F -> P``; their input-gradient GEMMs swap the two, weight-gradient GEMMs keep the forward's
  split; replicated GEMMs (the MoE router, the shared experts' gate score) keep the tokens as they
  come;
* attention products, softmax and the ops on attention scores or MLP activations split heads or
  features (``F``); the vocabulary-parallel loss splits the vocabulary and all-reduces three
  numbers per token (max, target logit, sum of exponentials);
* norms, residual adds and dropouts on the hidden state are ``R``, or ``S`` under sequence
  parallelism; the vocabulary-parallel embedding gives partial sums ``P``;
* MoE experts (grouped GEMMs) are split over ``ep`` ranks; a group's tokens are split over its
  ``tp`` ranks in the MoE block (Megatron-LM requires sequence parallelism for MoE with tp > 1);
  with expert tensor parallelism (``etp > 1``) each expert's GEMMs split over ``etp`` ranks as the
  dense MLP's over ``tp`` (``X -> Y`` column-parallel, ``Y -> Z`` row-parallel), on the tokens of
  those ranks; the tokens per rank scale by the busiest expert-parallel rank's share of the
  routing (:mod:`.experts`);
* shared experts (DeepSeekMoE, Qwen-MoE: a dense MLP every token runs beside the routed experts)
  are tensor-parallel as the dense MLP (column- then row-parallel over ``tp``, their partial sums
  reduced into the hidden state's layout before they are added to the experts' output) and, like
  every dense weight, replicated over the expert-parallel ranks (Megatron-LM's
  ``SharedExpertMLP``: ``ep`` is carved out of the data-parallel ranks, which hold the dense
  weights whole); their gate score (Qwen's ``shared_expert_gate``, one feature) is replicated
  as the router.
"""

from __future__ import annotations

from dataclasses import dataclass

from marssim.errors import InputError
from marssim.workload import Op, OpKind
from marssim.workload.llm.tprole import TpRole, tp_role

__all__ = ["Rule", "role_of", "rule_for", "strategy_of"]


@dataclass(frozen=True)
class Rule:
    """``split``: ``(loop, num, den)``: the loop's size becomes ``ceil(size * num / den)`` on a
    rank; ``want``: layout per input; ``out``: layout of the output; ``alias``: a view (no
    task); ``loss_reduce``: the vocabulary-parallel loss's small all-reduce follows; ``scale``:
    the rank does ``1/scale`` of the op where no loop names its share."""

    split: tuple[tuple[str, int, int], ...]
    want: tuple[str, ...]
    out: str
    alias: bool = False
    loss_reduce: bool = False
    scale: int = 1  # a rank does 1/scale of the op (MoE re-layouts, whose shards no loop names)


def role_of(op: Op, want: tuple[TpRole, ...] = tuple(TpRole)) -> TpRole:
    """The tensor-parallel role the graph builder declared on the GEMM ``op``, one of ``want``.
    Raises InputError naming the op when it declares none (or another): its split would be a
    guess."""
    role = tp_role(op)
    if role not in want:
        got = f"declares {getattr(role, 'value', role)!r}" if role is not None else "declares none"
        raise InputError(None, "workload", f"{op.name}: a GEMM whose tensor-parallel split is not known (it {got}; "
                                           f"expected the role {' or '.join(repr(r.value) for r in want)}, as the "
                                           f"transformer graph builder declares on every GEMM)")
    return TpRole(role)


def _base_name(name: str) -> str:
    """The forward op an op derives from: strip gradient and recomputation suffixes."""
    parts = name.split(".")
    while parts and parts[-1] in ("dgrad", "wgrad", "recompute"):
        parts.pop()
    return ".".join(parts)


def _suffix(name: str) -> str:
    """``decode.3.layers.3.attn.qkv`` -> ``attn.qkv``; ``prefill.embed.tokens`` -> ``embed.tokens``."""
    parts = name.split(".")
    if "layers" in parts:
        return ".".join(parts[parts.index("layers") + 2:])
    for i, part in enumerate(parts):
        if part in ("embed", "output", "final_norm", "loss", "sample", "last_token"):
            return ".".join(parts[i:])
    return name


def rule_for(op: Op, layouts: dict[str, str], tp: int, sp: bool, ep: int, etp: int = 1,
             load: tuple[int, int] = (1, 1)) -> Rule:
    """The rule of ``op`` given its producers' output ``layouts`` (by op name); ``etp``: expert
    tensor parallelism; ``load``: the busiest expert-parallel rank's tokens over the uniform
    share, as ``(numerator, denominator)``."""
    H = "S" if sp else "R"
    seq = (("H", 1, tp),) if sp else ()
    n_in = len(op.inputs)
    kind = op.kind
    name = op.name
    ins = [layouts.get(i, H) for i in op.inputs]
    if op.param("view"):
        return Rule((), tuple(ins), ins[0] if ins else H, alias=True)
    if kind == OpKind.GEMM:
        grad = op.param("grad")
        if op.param("grouped"):  # experts over ep ranks, each receiving ep ranks' tokens, split over tp
            num, den = load
            tokens = ("M", ep * num * (etp if etp > 1 else 1), tp * den)
            if etp <= 1:
                return Rule((("B", 1, ep), tokens), tuple("E" for _ in range(n_in)), "E")
            return _expert_tensor_parallel(op, grad, (("B", 1, ep), tokens), etp)
        role = role_of(op)
        column = role is TpRole.COLUMN
        if role is TpRole.REPLICATED:  # the MoE router: replicated weights, the tokens as they come
            return Rule((("M", 1, tp),) if sp else (), tuple(H for _ in range(n_in)), H)
        if grad is None:
            return Rule((("N", 1, tp),), ("R",), "F") if column else Rule((("K", 1, tp),), ("F",), "P")
        if grad == "input":
            return Rule((("K", 1, tp),), ("F",), "P") if column else Rule((("N", 1, tp),), ("R",), "F")
        # weight gradient: X (forward input), dY
        return Rule((("N", 1, tp),), ("R", "F"), "F") if column else Rule((("K", 1, tp),), ("F", "R"), "F")
    if kind == OpKind.MATMUL:
        return Rule((("H", 1, tp),), tuple("F" for _ in range(n_in)), "F")
    if kind == OpKind.SOFTMAX:
        if op.param("fn") == "cross_entropy":
            return Rule((("L", 1, tp),), ("F",), "F", loss_reduce=tp > 1)
        return Rule((("A", 1, tp),), ("F",), "F")
    if kind == OpKind.EMBEDDING:
        if _suffix(name) == "embed.tokens":
            return Rule((), ("R",), "P" if tp > 1 else "R")
        return Rule(seq, ("R",), H)
    if kind == OpKind.NORM:
        return Rule(seq, tuple(H for _ in range(n_in)), H)
    if kind == OpKind.RESHAPE:
        what = op.param("what")
        if what in ("dispatch", "combine_grad"):
            return Rule((), tuple(H for _ in range(n_in)), "E")
        if what in ("combine", "dispatch_grad"):
            return Rule((), ("E",) + tuple(H for _ in range(n_in - 1)), H)
        if what == "gate_grad":
            return Rule((), (H, "E"), H)
        if what == "sample":
            return Rule((), ("R",), "R")
        if what == "kv_write":  # each rank writes its heads' keys and values
            return Rule((), ("F", "F"), "F", scale=tp)
        return Rule((), tuple(ins), ins[0] if ins else H)
    if kind == OpKind.ELTWISE:
        fn = op.param("fn")
        if fn == "adam":
            return Rule((), ("R",), "R")
        if fn == "embedding_grad" and _suffix(_base_name(name)).startswith("embed.tokens"):
            return Rule((), ("R",), "F")
        if fn in ("quantize", "amax"):  # a low-precision cast: experts' tokens once exchanged, as their GEMMs
            ins = ["E" if lay == "D" else lay for lay in ins]
        if "F" in ins:
            return Rule((("C", 1, tp),), tuple("F" for _ in ins), "F")
        num, den = load
        for lay in ("Y", "Z"):  # expert tensor parallelism: the etp group's tokens
            if lay in ins:
                split = (("N", 1, ep), ("H", ep * num * etp, tp * den)) + ((("C", 1, etp),) if lay == "Y" else ())
                return Rule(split, tuple(lay for _ in ins), lay)
        if "E" in ins:
            return Rule((("N", 1, ep), ("H", ep * num, tp * den)), tuple("E" for _ in ins), "E")
        return Rule(seq, tuple(H for _ in ins), H)
    return Rule((), tuple(ins), H)


def _expert_tensor_parallel(op: Op, grad, base: tuple, etp: int) -> Rule:
    """An expert GEMM split over ``etp`` ranks as the dense column- and row-parallel rule over
    ``tp``, with the expert layouts (``R -> X``, ``F -> Y``, ``P -> Z``)."""
    column = role_of(op, (TpRole.COLUMN, TpRole.ROW)) is TpRole.COLUMN
    if grad is None:
        return Rule(base + (("N", 1, etp),), ("X",), "Y") if column else Rule(base + (("K", 1, etp),), ("Y",), "Z")
    if grad == "input":
        return Rule(base + (("K", 1, etp),), ("Y",), "Z") if column else Rule(base + (("N", 1, etp),), ("X",), "Y")
    return Rule(base + (("N", 1, etp),), ("X", "Y"), "Y") if column else Rule(base + (("K", 1, etp),), ("Y", "X"), "Y")


def strategy_of(op, rule) -> str:
    """The sharding strategy (the per-op mapping's vocabulary, :mod:`marssim.mapping.sharding`)
    that names ``op``'s tensor-parallel split under ``rule``, for reports: ``oc`` column-parallel
    or feature-split, ``ic`` row-parallel, ``head`` attention heads, ``seq`` sequence-parallel,
    ``dp`` experts over expert-parallel ranks, ``none`` replicated."""
    loops = {loop for loop, num, den in rule.split if den > 1 or num > 1}
    if op.param("grouped") and "B" in loops:
        choice = "dp"
    elif op.kind == OpKind.GEMM and op.param("grad") == "weight":
        choice = "oc" if "N" in loops else "ic" if "K" in loops else "none"
    elif op.kind == OpKind.GEMM:
        choice = "oc" if "N" in loops else "ic" if "K" in loops else "seq" if "M" in loops else "none"
    elif op.kind in (OpKind.MATMUL, OpKind.SOFTMAX) and loops & {"H", "A"}:
        choice = "head"
    elif "C" in loops or "L" in loops:
        choice = "oc" if op.kind != OpKind.SOFTMAX else "head"
    elif "H" in loops:
        choice = "seq"
    else:
        choice = "none"
    return choice

"""The backward pass and the optimizer step of a training graph, derived from its forward ops.

Backward ops are emitted as PyTorch's autograd runs them on one stream: forward ops in reverse
order; the gradient of a tensor read by several ops is summed (``.grad_sum``) before its
producer's backward; each op's backward reads exactly the forward tensors its derivative
needs -- those are the activations kept for backward, so the activation memory of a graph is
the set of forward outputs its backward reads (plus dropout masks), not a separate estimate.

================  =====================================================================================
forward op        backward ops (each with its own shapes, FLOPs and bytes)
================  =====================================================================================
linear (gemm)     ``.dgrad``: GEMM ``dY W^T`` (``grad=input``, reads the forward weights: ``shares``);
                  ``.wgrad``: GEMM ``X^T dY`` (``grad=weight``); together exactly 2x the forward MACs;
                  both carry the forward's tensor-parallel role (``tp_role``, :mod:`.tprole`)
matmul            ``.grad_a``, ``.grad_b``: the two products with the other operand (grouped-query
                  attention: the key/value gradients sum over each group of query heads)
fused attention   ``.grad``: one fused backward kernel (``fused=bwd``) reading Q, K, V, the context and
                  its gradient, writing the Q, K and V gradients as one tensor, which the views
                  ``.grad_q``, ``.grad_k``, ``.grad_v`` split
softmax           ``.grad``: ``Y * (dY - sum(dY * Y))`` (reads the softmax output)
cross-entropy     ``loss.grad``: ``(P - onehot) / tokens`` (reads the probabilities; the bytes of the
                  loss's ``cross_entropy`` kernels, :func:`.config.cross_entropy_op`)
dropout           ``.grad``: ``dY * mask / (1 - p)`` (reads the one-byte mask)
GeLU, SwiGLU,     ``.grad`` (``.grad_gate`` and ``.grad_up`` for SwiGLU): read the activation inputs
rotary
sigmoid gate      ``.grad`` (``dY sigmoid(s)``) and ``.grad_score`` (``sum(dY Z) (1 - sigmoid(s))``, reading the
                  gate's output ``Z`` and score ``s``): the shared experts' gate of Qwen-MoE
layer/RMS norm    ``.grad`` (norm ``layer_grad``/``rms_grad``): reads the norm input, gives the input
                  gradient and the scale (and shift) gradients
embedding         ``.grad``: scatter-add of the output gradient into the table gradient
position table    ``.grad``: the same for the learned positions
add (residual)    nothing: the gradient passes to both inputs
q/k/v views       ``attn.qkv.grad_concat``: one view of the three gradients (the fused projection's
                  output gradient)
MoE dispatch,     ``.grad`` (and ``.grad_gates`` for the combine's gating weights)
combine
================  =====================================================================================

Recomputation (``recompute``): ``selective`` re-runs the attention core (ops with ``core``) of a
block right before its backward (``.recompute`` copies, ``phase=recompute``) and its backward
reads the copies; ``full`` re-runs the whole block from its input when the block's backward
starts (Korthikanti et al. 2022, section 5).

Optimizer: per parameter group (the embedding, each block, the head) a ``.grad_buffer`` view
collects the weight gradients (Megatron-LM keeps them in contiguous fp32 buffers) and
``.adam`` updates every parameter of the group: an fp32 element-wise op over the group's
parameters reading the fp32 gradient (4 B), the fp32 master weight and both moments (12 B),
writing them back (12 B) and the 16-bit weight copy (2 B): 30 B and 14 FLOPs per parameter.
Norm and bias gradients are part of their group's buffer; the optimizer waits for the group's
weight gradients (GEMMs, embeddings).

Low-precision GEMMs (``gemm_dtype``, :mod:`.precision`): the backward of a GEMM reading a cast
input casts its output gradient first (``.grad_fp8``, E5M2; NVFP4: ``.grad_amax`` and
``.grad_fp4``), which ``.dgrad`` (with the weights' low-precision copy) and ``.wgrad`` (with the
kept low-precision input) read; a cast's gradient passes through unchanged (straight-through);
after each group's AdamW step ``.fp8_weights`` casts the group's GEMM weights (and their
transposes) for the next step (under current scaling reading them once more for their amax); an
FP8 step of delayed scaling ends its forward with ``fp8.amax_fwd`` and its backward with
``fp8.amax_bwd``, the amax-and-scale updates of the amax histories (current scaling: each cast
takes its tensor's amax first, ``.amax`` and ``.grad_amax``, and there is no history).
"""

from __future__ import annotations

from collections import defaultdict

from marssim.workload.builder import GraphBuilder, T
from marssim.workload.op import DTYPE_BYTES, Op, OpKind

from .config import TransformerConfig, cross_entropy_op
from .forward import quantize
from .precision import AMAX_HISTORY, FP8_TENSORS_BWD, FP8_TENSORS_FWD
from .tprole import TP_ROLE

__all__ = ["add_backward", "group_name", "ADAM_BYTES_PER_PARAM"]

ADAM_BYTES_PER_PARAM = 30
"""Bytes the AdamW step moves per parameter (fp32 gradient, master weight and two moments read;
master and moments written; the 16-bit weight written)."""


def group_name(layer: int, layers: int) -> str:
    """Name prefix of the parameter group of ``layer``: ``embed``, ``layers.i`` or ``head``."""
    if layer < 0:
        return "embed"
    if layer >= layers:
        return "head"
    return f"layers.{layer}"


class _Backward:
    def __init__(self, b: GraphBuilder, cfg: TransformerConfig, forward: tuple[Op, ...]) -> None:
        self.b = b
        self.cfg = cfg
        self.forward = [op for op in forward if op.kind != OpKind.INPUT]
        self.fwd = {op.name: op for op in forward}
        self.grads: dict[str, list[T]] = defaultdict(list)
        self.parts: dict[str, dict[str, T]] = defaultdict(dict)
        self.sub: dict[str, str] = {}  # forward op -> its recomputed copy
        self.param_grads: dict[int, list[T]] = defaultdict(list)
        self.norm_grads: dict[int, list[T]] = defaultdict(list)
        self.recomputed: set[int] = set()
        self.shapes: dict[str, tuple[int, int, int, int]] = {}  # recomputed tensors
        self.by_layer: dict[int, list[Op]] | None = None  # the forward ops of each layer, in order

    # ------------------------------------------------------------------ helpers
    def tensor(self, name: str, reader: Op) -> T:
        """Forward tensor ``name`` as the backward of ``reader`` reads it: the recomputed copy
        when ``reader`` is inside a recomputed region (the region's output, read by the
        backward of an op outside it, is the one its consumer kept)."""
        if reader.name in self.sub:
            name = self.sub.get(name, name)
        shape = self.shapes.get(name)
        return T(name, shape if shape is not None else self.fwd[name].out_shape)

    def _tag(self, op: Op, phase: str = "bwd") -> None:
        self.b.tags = {"layer": op.param("layer"), "phase": phase}

    def needs_grad(self, name: str) -> bool:
        op = self.fwd[name]
        return op.kind != OpKind.INPUT

    def contribute(self, name: str, grad: T) -> None:
        if self.needs_grad(name):
            self.grads[name].append(grad)

    def collect(self, op: Op) -> T | None:
        """The gradient of ``op``'s output: its contributions summed (or the q/k/v parts joined)."""
        b = self.b
        if op.name in self.parts:
            parts = self.parts.pop(op.name)
            order = sorted(parts, key=lambda n: self.order[n])
            ins = [parts[n] for n in order]
            if len(ins) == 1 and ins[0].shape == op.out_shape:
                return ins[0]
            return b.op(f"{op.name}.grad_concat", OpKind.RESHAPE, _nchw(op.out_shape), ins, op.out_shape,
                        params={"what": "concat", "view": True})
        got = self.grads.pop(op.name, [])
        if not got:
            return None
        if len(got) == 1:
            return got[0]
        return b.eltwise(f"{op.name}.grad_sum", *got, fn="grad_accumulate")

    # ------------------------------------------------------------------ recomputation
    def maybe_recompute(self, op: Op) -> None:
        layer = op.param("layer")
        cfg = self.cfg
        if cfg.recompute == "none" or layer is None or not 0 <= layer < cfg.layers or layer in self.recomputed:
            return
        if cfg.recompute == "selective" and not op.param("core"):
            return
        self.recomputed.add(layer)
        if self.by_layer is None:  # one pass over the forward, not one per recomputed layer
            self.by_layer = defaultdict(list)
            for o in self.forward:
                self.by_layer[o.param("layer")].append(o)
        chosen = [o for o in self.by_layer.get(layer, ()) if cfg.recompute == "full" or o.param("core")]
        b = self.b
        for o in chosen:
            params = {k: v for k, v in o.params if k != "phase"}
            params["phase"] = "recompute"
            weight = o.weight_elems
            if weight and o.kind in (OpKind.GEMM, OpKind.NORM):
                params["shares"] = o.param("shares") or o.name
            ins = [T(self.sub.get(n, n), s) for n, s in zip(o.inputs, o.in_shapes)]
            b.tags = {}
            t = b.op(f"{o.name}.recompute", o.kind, dict(o.loops), ins, o.out_shape, params=params,
                     weight_elems=weight, dtype=o.dtype)
            self.sub[o.name] = t.op
            self.shapes[t.op] = t.shape

    # ------------------------------------------------------------------ rules
    def run(self, loss: Op) -> None:
        b = self.b
        self.order = {op.name: i for i, op in enumerate(self.forward)}
        self.amax_update("fwd")
        self._tag(loss)
        probs = self.tensor(loss.name, loss)
        dlogits = b.eltwise(f"{loss.name}.grad", probs, fn="cross_entropy_grad")
        b.annotate_last(**cross_entropy_op(self.cfg, backward=True))
        self.contribute(loss.inputs[0], dlogits)
        for op in reversed(self.forward):
            if op is loss:
                continue
            if op.param("phase") != "fwd":
                continue
            self.maybe_recompute(op)
            self._tag(op)
            if op.kind == OpKind.RESHAPE and op.param("what") == "split":
                dy = self.collect(op)
                if dy is not None:
                    self.parts[op.inputs[0]][op.name] = dy
                continue
            dy = self.collect(op)
            if dy is None:
                continue
            getattr(self, "_" + op.kind.value)(op, dy)
        self.amax_update("bwd")
        self._optimizer()

    def _gemm(self, op: Op, dy: T) -> None:
        b = self.b
        loops = op.loop_dict
        grouped = bool(op.param("grouped", False))
        x = op.inputs[0]
        bsz, m, n, k = loops["B"], loops["M"], loops["N"], loops["K"]
        common: dict = {"grouped": True} if grouped else {}
        role = op.param(TP_ROLE)
        if role is not None:  # the backward GEMMs are split as the forward one (roles.rule_for swaps the layouts)
            common[TP_ROLE] = role
        low = op.param("w_dtype")
        if low is not None:  # a low-precision GEMM: the gradient is cast too, both backward GEMMs read it
            tags = dict(b.tags)
            dy = quantize(b, self.cfg, dy, f"{op.name}.grad_{self.cfg.gemm_dtype}", "e5m2")
            b.tags = tags
            common["in_dtypes"] = (low,)
        if self.needs_grad(x):
            weight = (bsz if grouped else 1) * k * n
            extra = {"w_dtype": low} if low is not None else {}
            dx = b.op(f"{op.name}.dgrad", OpKind.GEMM, {"B": bsz, "M": m, "N": k, "K": n}, [dy], (bsz, k, m, 1),
                      params={**common, **extra, "grad": "input", "shares": op.param("shares") or op.name,
                              "bias": False}, weight_elems=weight)
            self.contribute(x, dx)
        if low is not None:
            common["in_dtypes"] = (low, low)
        dw = b.op(f"{op.name}.wgrad", OpKind.GEMM, dict(loops), [self.tensor(x, op), dy],
                  (bsz if grouped else 1, n, k, 1), params={**common, "grad": "weight"})
        owner = self.fwd[op.param("shares")] if op.param("shares") else op
        self.param_grads[owner.param("layer")].append(dw)

    def _matmul(self, op: Op, dy: T) -> None:
        if op.param("fused"):
            self._fused_attention(op, dy)
            return
        b = self.b
        lm = op.loop_dict
        heads, g = lm["H"], op.param("kv_group", 1)
        a_name, b_name = op.inputs
        a, bb = self.tensor(a_name, op), self.tensor(b_name, op)
        n, m, nn, kk = lm["B"], lm["M"], lm["N"], lm["K"]
        kv = heads // g
        grouped = {"out_group": g} if g > 1 else {}
        if op.param("b_feature", "K") == "K":  # S = Q K^T: Q (n, H*K, M), K (n, kv*K, N), dS (n, H*N, M)
            dq = b.matmul(f"{op.name}.grad_a", dy, bb, heads=heads, b_feature="N", kv_group=g)
            dk = b.op(f"{op.name}.grad_b", OpKind.MATMUL, {"B": n, "H": heads, "M": nn, "N": kk, "K": m}, [dy, a],
                      (n, kv * kk, nn, 1), params={"b_feature": "N", "a_t": True, **grouped})
        else:  # C = P V: P (n, H*K, M) with K keys, V (n, kv*N, K), dC (n, H*N, M)
            dq = b.matmul(f"{op.name}.grad_a", dy, bb, heads=heads, b_feature="K", kv_group=g)
            dk = b.op(f"{op.name}.grad_b", OpKind.MATMUL, {"B": n, "H": heads, "M": kk, "N": nn, "K": m}, [a, dy],
                      (n, kv * nn, kk, 1), params={"b_feature": "N", "a_t": True, **grouped})
        self.contribute(a_name, dq)
        self.contribute(b_name, dk)

    def _fused_attention(self, op: Op, dy: T) -> None:
        from marssim.workload.op import fused_attention_shapes

        b = self.b
        lm = op.loop_dict
        ins = [self.tensor(name, op) for name in op.inputs] + [self.tensor(op.name, op), dy]
        _, out = fused_attention_shapes("bwd", lm["B"], lm["H"], lm["M"], lm["N"], lm["K"], op.param("kv_group", 1),
                                        op.name)
        params = {k: v for k, v in op.params if k in ("backend", "kv_group", "causal", "dropout")}
        grads = b.op(f"{op.name}.grad", OpKind.MATMUL, dict(op.loops), ins, out, params={**params, "fused": "bwd"})
        for part, name, t in zip("qkv", op.inputs, ins):
            view = b.op(f"{op.name}.grad_{part}", OpKind.RESHAPE, _nchw(t.shape), [grads], t.shape,
                        params={"what": "grad_split", "view": True})
            self.contribute(name, view)

    def _softmax(self, op: Op, dy: T) -> None:
        dx = self.b.eltwise(f"{op.name}.grad", self.tensor(op.name, op), dy, fn="softmax_grad")
        self.contribute(op.inputs[0], dx)

    def _eltwise(self, op: Op, dy: T) -> None:
        b = self.b
        fn = op.param("fn")
        if fn == "quantize":  # straight-through: the cast's gradient is its output's
            self.contribute(op.inputs[0], dy)
            return
        if fn == "add":
            for name in op.inputs:
                self.contribute(name, dy)
            if op.weight_elems:  # a learned table added (positions)
                self.param_grads[op.param("layer")].append(b.eltwise(f"{op.name}.grad", dy, fn="embedding_grad"))
            return
        if fn == "dropout":
            dx = b.eltwise(f"{op.name}.grad", dy, fn="dropout_grad")
            b.annotate_last(extra_per_elem=1, mask_of=self.sub.get(op.name, op.name))
            self.contribute(op.inputs[0], dx)
            return
        if fn == "swiglu":
            gate, up = (self.tensor(n, op) for n in op.inputs)
            self.contribute(op.inputs[0], b.eltwise(f"{op.name}.grad_gate", gate, up, dy, fn="swiglu_gate_grad"))
            self.contribute(op.inputs[1], b.eltwise(f"{op.name}.grad_up", gate, dy, fn="swiglu_up_grad"))
            return
        if fn == "gelu":
            dx = b.eltwise(f"{op.name}.grad", self.tensor(op.inputs[0], op), dy, fn="gelu_grad")
        elif fn == "rope":
            dx = b.eltwise(f"{op.name}.grad", dy, fn="rope_grad")
        elif fn == "router":
            dx = b.eltwise(f"{op.name}.grad", self.tensor(op.name, op), dy, fn="router")
        elif fn == "sigmoid_gate":  # z = y sigmoid(s): dy sigmoid(s), and sum_features(dy z) (1 - sigmoid(s))
            y_name, s_name = op.inputs
            score = self.tensor(s_name, op)
            loops = dict(op.loops)
            dx = b.op(f"{op.name}.grad", OpKind.ELTWISE, loops, [dy, score], dy.shape,
                      params={"fn": "sigmoid_gate_grad"})
            ds = b.op(f"{op.name}.grad_score", OpKind.ELTWISE, loops, [dy, self.tensor(op.name, op), score],
                      score.shape, params={"fn": "sigmoid_gate_score_grad"})
            self.contribute(s_name, ds)
            self.contribute(y_name, dx)
            return
        else:
            raise ValueError(f"no backward rule for element-wise {fn!r} ({op.name})")
        self.contribute(op.inputs[0], dx)

    def _norm(self, op: Op, dy: T) -> None:
        x = self.tensor(op.inputs[0], op)
        dx = self.b.op(f"{op.name}.grad", OpKind.NORM, dict(op.loops), [x, dy], x.shape,
                       params={"norm": f"{op.param('norm')}_grad", "shares": op.name}, weight_elems=op.weight_elems)
        self.norm_grads[op.param("layer")].append(dx)
        self.contribute(op.inputs[0], dx)

    def _embedding(self, op: Op, dy: T) -> None:
        self.param_grads[op.param("layer")].append(self.b.eltwise(f"{op.name}.grad", dy, fn="embedding_grad"))

    def _reshape(self, op: Op, dy: T) -> None:
        b = self.b
        what = op.param("what")
        if what == "dispatch":
            h = self.fwd[op.inputs[0]]
            dh = b.op(f"{op.name}.grad", OpKind.RESHAPE, _nchw(h.out_shape), [dy], h.out_shape,
                      params={"what": "dispatch_grad"})
            self.contribute(op.inputs[0], dh)
            return
        if what == "combine":
            y, gates = (self.fwd[n] for n in op.inputs)
            dexp = b.op(f"{op.name}.grad", OpKind.RESHAPE, _nchw(y.out_shape), [dy, self.tensor(gates.name, op)],
                        y.out_shape, params={"what": "combine_grad"})
            dgates = b.op(f"{op.name}.grad_gates", OpKind.RESHAPE, _nchw(gates.out_shape),
                          [dy, self.tensor(y.name, op)], gates.out_shape, params={"what": "gate_grad"})
            self.contribute(y.name, dexp)
            self.contribute(gates.name, dgates)
            return
        raise ValueError(f"no backward rule for reshape {what!r} ({op.name})")

    # ------------------------------------------------------------------ optimizer
    def _optimizer(self) -> None:
        b, cfg = self.b, self.cfg
        params: dict[int, int] = defaultdict(int)
        low_params: dict[int, int] = defaultdict(int)
        for op in self.forward:
            if op.weight_elems and not op.param("shares"):
                params[op.param("layer")] += op.weight_elems
                if op.param("w_dtype"):
                    low_params[op.param("layer")] += op.weight_elems
        for layer in sorted(params, key=lambda x: (x if x >= 0 else -1)):
            grads = self.param_grads.get(layer) or self.norm_grads.get(layer) or []
            if not grads:
                continue
            count = params[layer]
            prefix = group_name(layer, cfg.layers)
            b.tags = {"layer": layer, "phase": "opt"}
            buf = b.op(f"{prefix}.grad_buffer", OpKind.RESHAPE, {"N": 1, "C": count, "H": 1, "W": 1}, grads,
                       (1, count, 1, 1), params={"what": "grad_buffer", "view": True}, dtype="fp32")
            # reads the fp32 gradient (input) and master weight + moments (weights, 12 B), writes the
            # master weight (output, 4 B), the moments (8 B) and the 16-bit weight (2 B)
            adam = b.op(f"{prefix}.adam", OpKind.ELTWISE, {"N": 1, "C": count, "H": 1, "W": 1}, [buf],
                        (1, count, 1, 1), params={"fn": "adam", "extra_per_elem": 10, "keep": True},
                        weight_elems=3 * count, dtype="fp32")
            low = low_params.get(layer, 0)
            if low:  # the GEMM weights' low-precision copy and its transpose, for the next step
                src = "fp32" if cfg.fp8_param_gather else cfg.dtype  # the master itself, or its bf16 copy
                extra = DTYPE_BYTES[cfg.low_dtype]
                cast = {"fn": "quantize", "in_dtypes": (src,), "keep": True, "weights": True}
                if cfg.current_scaling:  # the weights' own amax first: one more read of them
                    extra += DTYPE_BYTES[src]
                    cast["amax"] = True
                b.op(f"{prefix}.{cfg.gemm_dtype}_weights", OpKind.ELTWISE, {"N": 1, "C": low, "H": 1, "W": 1},
                     [T(adam.op, (1, low, 1, 1))], (1, low, 1, 1), params={**cast, "extra_per_elem": extra},
                     dtype=cfg.low_dtype)
        b.tags = {}

    def amax_update(self, direction: str) -> None:
        """The fused amax-and-scale update of delayed scaling at the end of the forward (``fwd``)
        or the backward (``bwd``; none under current scaling or a block recipe): it reads and rewrites the amax history
        of every FP8 tensor of that direction (:data:`~.precision.AMAX_HISTORY` fp32 entries each)."""
        cfg, b = self.cfg, self.b
        if not cfg.amax_history:  # current scaling and the block recipes: each cast took its amaxes
            return
        gemms = sum(1 for op in self.forward if op.kind == OpKind.GEMM and op.param("w_dtype") == "fp8")
        if not gemms:
            return
        per = FP8_TENSORS_FWD if direction == "fwd" else FP8_TENSORS_BWD
        count = gemms * per * AMAX_HISTORY
        b.tags = {"layer": cfg.layers if direction == "fwd" else -1, "phase": direction}
        b.op(f"fp8.amax_{direction}", OpKind.ELTWISE, {"N": 1, "C": count, "H": 1, "W": 1}, [], (1, count, 1, 1),
             params={"fn": "amax_update", "extra_per_elem": 4, "keep": True}, dtype="fp32")


def _nchw(shape) -> dict[str, int]:
    n, c, h, w = shape
    return {"N": n, "C": c, "H": h, "W": w}


def add_backward(b: GraphBuilder, cfg: TransformerConfig, loss: str) -> None:
    """Append to ``b`` the backward of every forward op it holds (from the cross-entropy
    ``loss`` op), the recomputation ``cfg.recompute`` asks for, and the optimizer step."""
    _Backward(b, cfg, b.ops).run(b.last(loss))

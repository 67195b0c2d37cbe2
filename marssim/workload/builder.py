"""Build a :class:`Graph` layer by layer with exact shape inference.

>>> b = GraphBuilder("tiny", batch=2)
>>> x = b.input("image", c=3, h=32, w=32)
>>> y = b.conv("conv1", x, out_channels=16, kernel=3, stride=1, pad=1)
>>> y = b.eltwise("relu1", y, fn="relu")
>>> b.build().macs == 2 * 16 * 3 * 32 * 32 * 9
True
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import Graph
from .op import DTYPE_BYTES, Op, OpKind, Shape, norm_weight_elems

__all__ = ["GraphBuilder", "T"]


@dataclass(frozen=True, slots=True)
class T:
    """A tensor handle: the name of the op that produces it and its ``(n, c, h, w)`` shape."""

    op: str
    shape: Shape

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def c(self) -> int:
        return self.shape[1]

    @property
    def h(self) -> int:
        return self.shape[2]

    @property
    def w(self) -> int:
        return self.shape[3]


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _out_size(size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int = 1) -> int:
    eff = dilation * (kernel - 1) + 1
    out = (size + pad_lo + pad_hi - eff) // stride + 1
    if out <= 0:
        raise ValueError(f"window {kernel} (stride {stride}, pads {pad_lo}/{pad_hi}) does not fit input size {size}")
    return out


class GraphBuilder:
    """Accumulates ops; every method infers the output shape and returns its tensor handle.

    ``batch`` is the sample count (the ``n`` of graph inputs); ``dtype`` the element type of
    activations and weights; ``model`` tags every op (multi-model workloads)."""

    def __init__(self, name: str, *, batch: int, dtype: str = "fp16", model: str | None = None, spec: str = "") -> None:
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
        self.name = name
        self.batch = batch
        self.dtype = dtype
        self.model = model or name
        self.spec = spec
        self.tags: dict = {}
        """Parameters added to every op built from now on (``layer``, ``phase``...); an op's own
        parameters win over them."""
        self._ops: list[Op] = []
        self._names: set[str] = set()

    def _add(self, name: str, kind: OpKind, loops: dict[str, int], inputs: list[T], out: Shape,
             params: dict | None = None, weight_elems: int = 0, dtype: str | None = None) -> T:
        if name in self._names:
            raise ValueError(f"duplicate op name {name!r}")
        self._names.add(name)
        merged = {**self.tags, **(params or {})} if self.tags else (params or {})
        op = Op(name=name, kind=kind, loops=tuple(loops.items()), inputs=tuple(t.op for t in inputs),
                in_shapes=tuple(t.shape for t in inputs), out_shape=tuple(int(v) for v in out),  # type: ignore[arg-type]
                params=tuple(sorted(merged.items())), weight_elems=int(weight_elems), dtype=dtype or self.dtype,
                model=self.model)
        self._ops.append(op)
        return T(name, op.out_shape)

    def op(self, name: str, kind: OpKind, loops: dict[str, int], inputs: list[T], out: Shape, *,
           params: dict | None = None, weight_elems: int = 0, dtype: str | None = None) -> T:
        """Any op, its shapes given by the caller (training-graph construction; no inference)."""
        return self._add(name, kind, loops, inputs, out, params, weight_elems, dtype)

    @property
    def ops(self) -> tuple[Op, ...]:
        """The ops added so far, in order."""
        return tuple(self._ops)

    def annotate_last(self, *, dtype: str | None = None, **params) -> None:
        """Add ``params`` to the op added last (before anything refers to it); ``dtype``: its
        output's element type, when not the one it was built with."""
        from dataclasses import replace

        op = self._ops[-1]
        merged = dict(op.params)
        merged.update(params)
        self._ops[-1] = replace(op, params=tuple(sorted(merged.items())), dtype=dtype or op.dtype)

    def share_weights(self, owner_of) -> None:
        """Ops that hold weights and for which ``owner_of(name)`` gives a name read those
        weights instead of owning them (decode steps reuse the prefill's weights)."""
        from dataclasses import replace

        for i, op in enumerate(self._ops):
            if op.weight_elems and not op.param("shares"):
                owner = owner_of(op.name)
                if owner:
                    merged = dict(op.params)
                    merged["shares"] = owner
                    self._ops[i] = replace(op, params=tuple(sorted(merged.items())))

    def last(self, name: str) -> Op:
        """The op called ``name`` added so far (KeyError if none)."""
        for op in reversed(self._ops):
            if op.name == name:
                return op
        raise KeyError(name)

    # ------------------------------------------------------------------ ops
    def input(self, name: str, c: int, h: int = 1, w: int = 1, n: int | None = None, resident: bool = False,
              dtype: str | None = None) -> T:
        """A graph input of shape ``(batch, c, h, w)``, resident on a host (``resident``: in the
        memory of the devices that read it, like a KV cache); ``dtype``: its element type when
        not the graph's."""
        n = self.batch if n is None else n
        return self._add(name, OpKind.INPUT, {"N": n, "C": c, "H": h, "W": w}, [], (n, c, h, w),
                         {"resident": True} if resident else None, dtype=dtype)

    def conv(self, name: str, x: T, out_channels: int, kernel: int | tuple[int, int], stride: int | tuple[int, int] = 1,
             pad: int | tuple[int, int] | tuple[int, int, int, int] | None = None, groups: int = 1, bias: bool = False,
             dilation: int = 1) -> T:
        """2-D convolution. ``pad`` None means ``kernel // 2``; a 4-tuple is (top, left, bottom, right).
        ``groups == in_channels == out_channels`` is depthwise."""
        r, s = _pair(kernel)
        sh, sw = _pair(stride)
        if pad is None:
            pads = (r // 2, s // 2, r // 2, s // 2)
        elif isinstance(pad, int):
            pads = (pad, pad, pad, pad)
        elif len(pad) == 2:
            pads = (pad[0], pad[1], pad[0], pad[1])
        else:
            pads = tuple(pad)  # type: ignore[assignment]
        n, c, h, w = x.shape
        if c % groups or out_channels % groups:
            raise ValueError(f"{name}: channels {c}->{out_channels} not divisible by groups {groups}")
        p = _out_size(h, r, sh, pads[0], pads[2], dilation)
        q = _out_size(w, s, sw, pads[1], pads[3], dilation)
        depthwise = groups > 1 and groups == c == out_channels
        c_per_group = c // groups
        params = {"stride": (sh, sw), "pad": pads, "groups": groups, "bias": bias, "dilation": dilation}
        if depthwise:
            params["depthwise"] = True
        loops = {"N": n, "K": out_channels, "C": c_per_group, "P": p, "Q": q, "R": r, "S": s}
        weights = out_channels * c_per_group * r * s + (out_channels if bias else 0)
        return self._add(name, OpKind.CONV, loops, [x], (n, out_channels, p, q), params, weights)

    def linear(self, name: str, x: T, out_features: int, bias: bool = True, grouped: bool = False,
               shares: str | None = None, params: dict | None = None) -> T:
        """Fully connected layer over the feature axis: ``(n, K, tokens, 1) -> (n, N, tokens, 1)``.

        ``grouped``: ``n`` indexes independent weight matrices (MoE experts, each over its
        ``tokens``), ``n * K * N`` weights. ``shares``: the op whose weights this one reads
        (tied embeddings): they are counted as traffic, not as parameters. ``params``: more
        params of the op (a transformer's tensor-parallel role, input and weight types)."""
        n, c, h, w = x.shape
        if w != 1:
            raise ValueError(f"{name}: linear expects (n, features, tokens, 1); flatten {x.shape} first")
        loops = {"B": n, "M": h, "N": out_features, "K": c}
        weights = (n if grouped else 1) * c * out_features + (out_features if bias else 0)
        params = {**(params or {}), "bias": bias}
        if grouped:
            params["grouped"] = True
        if shares:
            params["shares"] = shares
        return self._add(name, OpKind.GEMM, loops, [x], (n, out_features, h, 1), params, weights)

    def matmul(self, name: str, a: T, b: T, heads: int, b_feature: str = "K", kv_group: int = 1,
               causal: bool = False) -> T:
        """Batched activation x activation product per sample and head.

        ``a`` is ``(n, heads*K, M, 1)``. With ``b_feature='K'`` (like ``Q @ K^T``), ``b`` is
        ``(n, heads*K, N, 1)``; with ``'N'`` (like ``P @ V``), ``b`` is ``(n, heads*N, K, 1)``.
        The output is ``(n, heads*N, M, 1)``. ``kv_group``: each head of ``b`` serves that many
        heads of ``a`` (grouped-query attention), so ``b`` has ``heads / kv_group`` heads.
        ``causal`` marks attention products under a causal mask (recorded; the work counted is
        the full product, see :mod:`marssim.workload.llm`)."""
        n, ac, m, aw = a.shape
        if ac % heads:
            raise ValueError(f"{name}: features {ac} not divisible by heads {heads}")
        if kv_group < 1 or heads % kv_group:
            raise ValueError(f"{name}: {heads} heads cannot share key/value heads in groups of {kv_group}")
        kv = heads // kv_group
        k = ac // heads
        if b_feature == "K":
            if b.c != kv * k:
                raise ValueError(f"{name}: operand features {a.c} and {b.c} do not match ({kv} key heads of {k})")
            nn = b.h
        elif b_feature == "N":
            if b.h != k:
                raise ValueError(f"{name}: contraction {k} does not match rows {b.h} of the second operand")
            if b.c % kv:
                raise ValueError(f"{name}: features {b.c} not divisible by {kv} value heads")
            nn = b.c // kv
        else:
            raise ValueError(f"{name}: b_feature must be 'K' or 'N', got {b_feature!r}")
        loops = {"B": n, "H": heads, "M": m, "N": nn, "K": k}
        params: dict = {"b_feature": b_feature}
        if kv_group > 1:
            params["kv_group"] = kv_group
        if causal:
            params["causal"] = True
        return self._add(name, OpKind.MATMUL, loops, [a, b], (n, heads * nn, m, 1), params)

    def pool(self, name: str, x: T, kernel: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
             pad: int | tuple[int, int, int, int] = 0, mode: str = "max", ceil_mode: bool = False) -> T:
        """Window pooling (``mode`` max or avg)."""
        r, s = _pair(kernel)
        sh, sw = _pair(stride if stride is not None else kernel)
        pads = (pad, pad, pad, pad) if isinstance(pad, int) else tuple(pad)
        n, c, h, w = x.shape
        p = _out_size(h, r, sh, pads[0], pads[2])
        q = _out_size(w, s, sw, pads[1], pads[3])
        if ceil_mode:
            p = -(-(h + pads[0] + pads[2] - r) // sh) + 1
            q = -(-(w + pads[1] + pads[3] - s) // sw) + 1
        loops = {"N": n, "C": c, "P": p, "Q": q, "R": r, "S": s}
        params = {"stride": (sh, sw), "pad": pads, "mode": mode}
        return self._add(name, OpKind.POOL, loops, [x], (n, c, p, q), params)

    def global_pool(self, name: str, x: T, mode: str = "avg") -> T:
        """Pool the whole spatial extent: ``(n, c, h, w) -> (n, c, 1, 1)``."""
        n, c, h, w = x.shape
        loops = {"N": n, "C": c, "P": 1, "Q": 1, "R": h, "S": w}
        params = {"stride": (h, w), "pad": (0, 0, 0, 0), "mode": mode, "global": True}
        return self._add(name, OpKind.POOL, loops, [x], (n, c, 1, 1), params)

    def eltwise(self, name: str, *xs: T, fn: str = "relu", weight_elems: int = 0) -> T:
        """Element-wise op over inputs of one shape (``add``, ``mul``, ``relu``, ``gelu``...).
        ``weight_elems`` counts a learned operand (a bias or position embedding)."""
        if not xs:
            raise ValueError(f"{name}: eltwise needs at least one input")
        shape = xs[0].shape
        for t in xs[1:]:
            if t.shape != shape:
                raise ValueError(f"{name}: input shapes {shape} and {t.shape} differ")
        n, c, h, w = shape
        return self._add(name, OpKind.ELTWISE, {"N": n, "C": c, "H": h, "W": w}, list(xs), shape, {"fn": fn},
                         weight_elems)

    def norm(self, name: str, x: T, norm: str = "batch") -> T:
        """Batch norm (inference: per-channel scale and shift), layer norm (over the features),
        RMS norm (``rms``: over the features, scale only) or local response norm (``lrn``: over a
        window of neighbouring channels, no parameters)."""
        if norm not in ("batch", "layer", "rms", "lrn"):
            raise ValueError(f"{name}: norm must be 'batch', 'layer', 'rms' or 'lrn', got {norm!r}")
        n, c, h, w = x.shape
        weights = norm_weight_elems(norm, c)
        return self._add(name, OpKind.NORM, {"N": n, "C": c, "H": h, "W": w}, [x], x.shape, {"norm": norm}, weights)

    def softmax(self, name: str, x: T, heads: int) -> T:
        """Softmax over the keys of attention scores ``(n, heads*L, H, 1)``."""
        n, c, h, w = x.shape
        if c % heads or w != 1:
            raise ValueError(f"{name}: expected scores (n, heads*keys, queries, 1), got {x.shape}")
        loops = {"N": n, "A": heads, "H": h, "L": c // heads}
        return self._add(name, OpKind.SOFTMAX, loops, [x], x.shape, {})

    def embedding(self, name: str, ids: T, vocab: int, hidden: int) -> T:
        """Table lookup: token ids ``(n, 1, tokens, 1)`` -> ``(n, hidden, tokens, 1)``."""
        n, _, h, _ = ids.shape
        return self._add(name, OpKind.EMBEDDING, {"N": n, "H": h, "C": hidden}, [ids], (n, hidden, h, 1),
                         {"vocab": vocab}, vocab * hidden)

    def reshape(self, name: str, *xs: T, shape: tuple[int, int, int, int], what: str = "reshape",
                weight_elems: int = 0) -> T:
        """Memory-only re-layout (flatten, transpose, concat, ...) to ``shape``; batch preserved.
        ``weight_elems`` counts a learned operand (e.g. a class token concatenated to the tokens)."""
        if any(t.n != shape[0] for t in xs):
            raise ValueError(f"{name}: reshape must keep the batch dimension")
        n, c, h, w = shape
        return self._add(name, OpKind.RESHAPE, {"N": n, "C": c, "H": h, "W": w}, list(xs), shape, {"what": what},
                         weight_elems)

    def flatten(self, name: str, x: T) -> T:
        """``(n, c, h, w) -> (n, c*h*w, 1, 1)``."""
        n, c, h, w = x.shape
        return self.reshape(name, x, shape=(n, c * h * w, 1, 1), what="flatten")

    def build(self) -> Graph:
        """The finished :class:`Graph`."""
        return Graph(self.name, self._ops, batch=self.batch, spec=self.spec or self.name)

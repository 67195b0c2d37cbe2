"""A Hugging Face ``config.json`` read into a :class:`~.config.TransformerConfig`.

Spec strings: ``hf:PATH`` or ``hf:PATH:key=value,...`` (the workload grammar: parameters after the
last ``:``, as for a zoo model), where ``PATH`` is a ``config.json`` file (any name ending in
``.json``) or a directory holding one; the parameters set any field of the configuration
(``hf:llama/config.json:mode=train,batch=1,seq=4096``), as for ``llama:...``.

==================================  ==========================================================
``model_type``                      read as
==================================  ==========================================================
``llama``, ``mistral``, ``qwen2``   family ``llama``: RMSNorm, SwiGLU MLP (``hidden_act``
                                    ``silu``), rotary positions, grouped-query attention
``mixtral``                         family ``moe``: the same attention, ``num_local_experts``
                                    SwiGLU experts of ``intermediate_size``,
                                    top-``num_experts_per_tok``
``qwen2_moe``, ``qwen3_moe``        family ``moe``: ``num_experts`` routed experts of
                                    ``moe_intermediate_size``, top-``num_experts_per_tok``; Qwen2-MoE's
                                    shared expert of ``shared_expert_intermediate_size`` (0: none)
                                    with its sigmoid gate; dense blocks of ``intermediate_size``
                                    where ``mlp_only_layers`` lists the first ones
``deepseek`` (DeepSeekMoE, its      family ``moe``: ``n_routed_experts`` routed experts of
``trust_remote_code`` config)       ``moe_intermediate_size``, top-``num_experts_per_tok``,
                                    ``n_shared_experts`` shared experts of the same width, the first
                                    ``first_k_dense_replace`` blocks dense of ``intermediate_size``
``gpt_neox``                        family ``gpt`` with rotary positions, LayerNorm, GeLU MLP,
                                    biases, untied input and output embeddings
``deepseek_v2``, ``deepseek_v3``    refused: multi-head latent attention (``kv_lora_rank``) is
                                    not modelled
==================================  ==========================================================

Fields read: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads`` (default: the attention heads), ``head_dim`` (when it is not hidden /
heads), ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``,
``tie_word_embeddings`` (default: false, as the architectures' own defaults), ``torch_dtype``
(``bfloat16``, ``float16``, ``float32``; default bf16).

Where the architecture differs from what marssim builds, in ways that change neither the
parameter count beyond 0.01 % nor the work of a step, it is read as the nearest model and said so
here: Qwen2's biases of the query, key and value projections (``attention_bias`` of Llama and
Mistral likewise) are left out (0.002 % of Qwen2.5-7B's parameters); GPT-NeoX's parallel residual
(``use_parallel_residual``: attention and MLP read the same input) runs the two one after the
other, the same FLOPs and bytes; its partial rotary embedding (``rotary_pct``) is timed over the
whole head (an element-wise op); Qwen3's per-head RMSNorm of the queries and keys (``q_norm``,
``k_norm``: 256 parameters a block) is left out. What changes the work is refused, naming the
field: sliding-window attention (``sliding_window`` with ``use_sliding_window`` not false), biased
MLPs (``mlp_bias``), dense layers among the expert layers other than the first ones
(``mlp_only_layers`` other than ``[0, ..., k-1]``, ``decoder_sparse_step`` or DeepSeek's
``moe_layer_freq`` other than 1), an activation other than SiLU (GeLU for GPT-NeoX), MLA
(DeepSeek-V2/V3's ``kv_lora_rank``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from marssim.errors import InputError

__all__ = ["HF_MODEL_TYPES", "is_hf_spec", "split_hf_spec", "hf_base", "load_hf", "MAX_CONFIG_BYTES"]

HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "mixtral": "moe", "qwen2_moe": "moe",
                  "qwen3_moe": "moe", "deepseek": "moe", "gpt_neox": "gpt"}
"""``model_type`` of a Hugging Face configuration -> the family it is read as."""

MAX_CONFIG_BYTES = 1 << 20
"""A ``config.json`` larger than this (1 MiB) is refused (published ones are a few KiB)."""

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_PREFIX = "hf:"


def is_hf_spec(spec: str) -> bool:
    """True for ``hf:PATH`` and ``hf:PATH:key=value,...``."""
    return isinstance(spec, str) and spec.startswith(_PREFIX)


def split_hf_spec(spec: str) -> tuple[str, str]:
    """``(path, parameters text)`` of ``hf:PATH[:key=value,...]``: the parameters follow the last
    ``:`` when it is followed by ``key=value`` items (as :func:`marssim.specs.split_spec` reads a
    zoo spec)."""
    rest = spec[len(_PREFIX):]
    path, sep, params = rest.rpartition(":")
    if sep and path and "=" in params:
        return path.strip(), params
    return rest.strip(), ""


def _read(path: str, spec: str) -> tuple[dict[str, Any], str]:
    """The JSON object of a ``config.json`` (``path`` a file or a directory holding one), and
    the file's path."""
    if not path:
        raise InputError(spec, "", "expected hf:PATH with PATH a Hugging Face config.json (or its directory)")
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    where = str(p)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise InputError(where, "", "file not found (expected a Hugging Face config.json)") from None
    except OSError as exc:
        raise InputError(where, "", f"cannot read file ({exc.strerror})") from None
    if size > MAX_CONFIG_BYTES:
        raise InputError(where, "", f"{size:,} bytes; expected a config.json of at most {MAX_CONFIG_BYTES:,} bytes")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(where, "", f"cannot read file ({exc})") from None
    except json.JSONDecodeError as exc:
        raise InputError(where, f"line {exc.lineno}, column {exc.colno}", f"not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise InputError(where, "", "expected a JSON object (a Hugging Face model configuration)")
    return data, where


def _model_name(data: dict[str, Any], where: str) -> str:
    """A name for the model: ``_name_or_path``'s last part, else the config's directory."""
    named = data.get("_name_or_path")
    if isinstance(named, str) and named.strip():
        return named.strip().rstrip("/").rsplit("/", 1)[-1]
    p = Path(where)
    return p.parent.name if p.name == "config.json" and p.parent.name else p.stem


def hf_base(spec: str) -> tuple[dict[str, Any], str]:
    """``(configuration fields, model name)`` of the ``config.json`` that ``spec``
    (``hf:PATH[:...]``) names, per the module docstring; InputError naming the file and the
    field otherwise."""
    path, _ = split_hf_spec(spec)
    data, where = _read(path, spec)

    def get(key: str, default: Any = None, *, required: bool = True, kind: type = int) -> Any:
        if key not in data or data[key] is None:
            if required and default is None:
                what = "a positive integer" if kind is int else kind.__name__
                raise InputError(where, key, f"missing; expected {what}")
            return default
        value = data[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError(where, key, f"expected a positive integer, got {value!r}")
        if kind is bool and not isinstance(value, bool):
            raise InputError(where, key, f"expected true or false, got {value!r}")
        return value

    def refuse(key: str, message: str) -> None:
        raise InputError(where, key, message)

    model_type = data.get("model_type")
    if model_type in ("deepseek_v2", "deepseek_v3") or "kv_lora_rank" in data or "q_lora_rank" in data:
        refuse("kv_lora_rank" if "kv_lora_rank" in data else "model_type",
               "multi-head latent attention (DeepSeek's MLA) is not modelled; expected grouped-query attention "
               f"({', '.join(HF_MODEL_TYPES)})")
    if model_type not in HF_MODEL_TYPES:
        refuse("model_type", f"expected one of {', '.join(HF_MODEL_TYPES)}, got {model_type!r}")
    family = HF_MODEL_TYPES[model_type]
    hidden = get("hidden_size")
    heads = get("num_attention_heads")
    base: dict[str, Any] = {
        "family": family, "layers": get("num_hidden_layers"), "hidden": hidden, "heads": heads,
        "vocab": get("vocab_size"), "kv_heads": get("num_key_value_heads", heads),
        "tie_embeddings": get("tie_word_embeddings", False, kind=bool),
    }
    head_dim = get("head_dim", 0, required=False)
    if head_dim and head_dim * heads != hidden:
        base["head_dim"] = head_dim
    positions = get("max_position_embeddings", 0, required=False)
    if positions:
        base["max_positions"] = positions
    base["seq"] = min(positions or 4096, 8192)
    dtype = data.get("torch_dtype", data.get("dtype", "bfloat16"))
    if dtype not in _DTYPES:
        refuse("torch_dtype", f"expected one of {', '.join(_DTYPES)}, got {dtype!r}")
    base["dtype"] = _DTYPES[dtype]
    act = data.get("hidden_act", "silu" if family != "gpt" else "gelu")
    if family == "gpt":
        if act not in ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
            refuse("hidden_act", f"expected a GeLU (gelu, gelu_new, gelu_fast) for GPT-NeoX, got {act!r}")
        base.update(norm="layer", activation="gelu", positions="rotary", bias=True, dropout=0.0,
                    ffn=get("intermediate_size", 4 * hidden))
        return base, _model_name(data, where)
    if act != "silu":
        refuse("hidden_act", f"expected silu (a SwiGLU MLP), got {act!r}")
    if get("mlp_bias", False, kind=bool):
        refuse("mlp_bias", "biased MLP projections are not modelled for this family; expected false")
    window = data.get("sliding_window")
    if window is not None and data.get("use_sliding_window", True) is not False:
        refuse("sliding_window", f"sliding-window attention ({window!r} tokens) is not modelled; expected null (full "
                                 "attention) or use_sliding_window false")
    base.update(norm="rms", activation="swiglu", positions="rotary", bias=False, dropout=0.0)
    if family == "llama":
        base["ffn"] = get("intermediate_size")
        return base, _model_name(data, where)
    # mixture of experts
    if model_type == "mixtral":
        base.update(experts=get("num_local_experts"), top_k=get("num_experts_per_tok"), ffn=get("intermediate_size"))
    elif model_type == "deepseek":
        _deepseek(data, base, get, refuse)
    else:
        _qwen_moe(data, base, get, refuse)
    base["capacity_factor"] = 1.0
    return base, _model_name(data, where)


def _deepseek(data: dict[str, Any], base: dict[str, Any], get, refuse) -> None:
    """DeepSeekMoE's fields (``model_type`` ``deepseek``) into ``base``."""
    if data.get("moe_layer_freq", 1) != 1:
        refuse("moe_layer_freq", f"expected 1 (experts in every block after the first dense ones), got "
                                 f"{data['moe_layer_freq']!r}")
    if not data.get("n_routed_experts"):
        refuse("n_routed_experts", "missing; expected the routed experts of a DeepSeekMoE model (a positive integer)")
    if data.get("scoring_func", "softmax") != "softmax":
        refuse("scoring_func", f"expected softmax (DeepSeekMoE's router), got {data['scoring_func']!r}")
    shared = get("n_shared_experts", 0, required=False) if data.get("n_shared_experts") else 0  # null or 0: none
    dense = data.get("first_k_dense_replace") or 0
    if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
        refuse("first_k_dense_replace", f"expected a non-negative integer, got {dense!r}")
    base.update(experts=get("n_routed_experts"), top_k=get("num_experts_per_tok"),
                expert_ffn=get("moe_intermediate_size"), shared_experts=shared, dense_layers=dense,
                ffn=get("intermediate_size"))


def _qwen_moe(data: dict[str, Any], base: dict[str, Any], get, refuse) -> None:
    """Qwen2-MoE's and Qwen3-MoE's fields into ``base``."""
    if data.get("decoder_sparse_step", 1) != 1:
        refuse("decoder_sparse_step", f"expected 1 (experts in every block), got {data['decoder_sparse_step']!r}")
    dense_list = data.get("mlp_only_layers") or []
    if not isinstance(dense_list, list) or dense_list != list(range(len(dense_list))):
        refuse("mlp_only_layers", f"dense blocks are modelled as the first ones only; expected [] or [0, ..., k-1], "
                                  f"got {dense_list!r}")
    shared = get("shared_expert_intermediate_size") if data.get("shared_expert_intermediate_size") else 0
    base.update(experts=get("num_experts"), top_k=get("num_experts_per_tok"), expert_ffn=get("moe_intermediate_size"),
                ffn=get("intermediate_size", data.get("moe_intermediate_size")), dense_layers=len(dense_list))
    if shared:
        base.update(shared_experts=1, shared_ffn=shared, shared_gate=True)


def load_hf(spec: str, *, batch: int | None = None):
    """The graph of ``hf:PATH[:key=value,...]``: the configuration of the ``config.json``, the
    spec's parameters (any field of :class:`~.config.TransformerConfig`: mode, batch, seq, ...)
    over it, ``batch`` over those when given. InputError naming the file (or the spec) and the
    key otherwise."""
    from marssim.specs import coerce, field_like, format_spec, parse_params

    from .build import build_transformer
    from .config import SPEC_FIELDS, TransformerConfig, config_from

    base, name = hf_base(spec)
    path, text = split_hf_spec(spec)
    defaults = TransformerConfig(name=name, **base).params_dict()
    params: dict[str, Any] = {}
    for key, raw in parse_params(spec, text).items():
        if key not in SPEC_FIELDS:
            raise InputError(spec, key, f"unknown parameter; expected one of: {', '.join(sorted(SPEC_FIELDS))}")
        params[key] = coerce(spec, key, raw, field_like(defaults[key]))
    if batch is not None:
        params["batch"] = batch
    try:
        cfg = config_from(base, name, **params)
    except InputError as err:
        raise InputError(spec, problems=err.problems) from None
    return build_transformer(cfg, spec=format_spec(f"hf:{path}", params))

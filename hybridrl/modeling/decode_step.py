"""One decode step of a Llama-family model run straight on its weights: what ``rollout.hf_fast_decode`` runs.

A decode step multiplies a few rows (the sequences being sampled) through every layer, so on a CPU most of its
time outside the products is the modules' dispatch: hooks, keyword plumbing, mask construction and a dozen small
ops per norm and rotary. :class:`DecodeStep` runs the same arithmetic as transformers' forward for the model types
of :data:`FAST_DECODE_MODEL_TYPES` with none of that: per layer one RMSNorm kernel, one product for q, k and v
and one for gate and up (their weights concatenated and packed once for oneDNN where
:func:`~hybridrl.modeling.prepacked.prepacking_available`: bf16 on CPUs with native bf16), the model's own rotary module and activation, and :func:`~hybridrl.modeling.attention.direct_attention` on
the cache. Logits are the module forward's bit for bit on CPU with the default attention (bf16 and fp32, the
module's linears packed alike; ``tests/unit/workers/test_decode_step.py``). Measured on the 2-core
AMD EPYC (AVX-512 BF16), bf16, both prepacked, alternated in one process: one step of 32 rows, SmolLM2-135M
92–110 → 75–81 ms, the demo's tiny model 7.0–9.4 → 3.4–3.8 ms; a whole ``generate`` of 8 prompts × 4 samples
(prefill and sampling included, ``benchmarks/hf_decode.py``), SmolLM2's shapes × 32 tokens 3.20 → 2.68 s, tiny
× 16 tokens 72 → 54 ms.

Only what the types listed share is covered: pre-norm decoder layers of RMSNorm, attention with rotary positions
(Qwen3's per-head q/k norms included) and a gated MLP, no sliding window, plain ``nn.Linear`` products (no LoRA
layers) and a bias-free head whose output the model returns unchanged. :func:`fast_decode_unsupported` says why a
model is not covered; the engine then runs the module's forward, as before.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from hybridrl.modeling.attention import direct_attention
from hybridrl.modeling.prepacked import pack_linear_weight, packed_linear, prepacking_available

FAST_DECODE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Model types whose decoder layers :class:`DecodeStep` reproduces (checked against transformers' modelling code)."""

_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")


def fast_decode_unsupported(model: nn.Module) -> Optional[str]:
    """Why :class:`DecodeStep` cannot run ``model`` (``None`` if it can)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAST_DECODE_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {sorted(FAST_DECODE_MODEL_TYPES)}"
    inner, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return f"{type(model).__name__} does not have transformers' decoder structure (a wrapped or adapted model)"
    if type(head) is not nn.Linear or head.bias is not None or type(inner.embed_tokens) is not nn.Embedding:
        return "the head is not a bias-free nn.Linear or the embedding not an nn.Embedding (adapters?)"
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "sliding_window", None) is not None and (
            model_type == "mistral" or any(kind != "full_attention" for kind in layer_types)):
        return f"sliding-window attention (sliding_window={config.sliding_window})"
    for index, layer in enumerate(inner.layers):
        modules = [layer.get_submodule(name) for name in _LINEARS]
        if any(type(module) is not nn.Linear for module in modules):
            return f"layer {index} has linear layers that are not plain nn.Linear (LoRA adapters?)"
        for group in (modules[:3], modules[4:6]):
            if len({module.bias is None for module in group}) > 1:
                return f"layer {index} mixes biased and bias-free projections"
    return None


class _Product:
    """``x Wᵀ + b`` for one weight ``[out, in]``, against a oneDNN-packed copy when ``packed``."""

    def __init__(self, weights: list[torch.Tensor], biases: list[Optional[torch.Tensor]], packed: bool) -> None:
        weight = weights[0] if len(weights) == 1 else torch.cat(weights)
        self.bias = None if biases[0] is None else (biases[0] if len(biases) == 1 else torch.cat(biases))
        self.weight = pack_linear_weight(weight) if packed else weight
        self.packed = packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias) if self.packed else F.linear(x, self.weight, self.bias)


class _Layer:
    """One decoder layer's weights: norms, the q/k/v and gate/up products (one each when packed, else one per
    projection: an unpacked concatenation would be a second copy of the weights), o and down."""

    def __init__(self, layer: nn.Module, packed: bool) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = _norm_of(layer.input_layernorm), _norm_of(layer.post_attention_layernorm)
        self.q_norm = _norm_of(attention.q_norm) if hasattr(attention, "q_norm") else None
        self.k_norm = _norm_of(attention.k_norm) if hasattr(attention, "k_norm") else None
        self.scaling = attention.scaling
        self.qkv = _products([attention.q_proj, attention.k_proj, attention.v_proj], packed)
        self.gate_up = _products([mlp.gate_proj, mlp.up_proj], packed)
        self.o, self.down = _products([attention.o_proj], packed)[0], _products([mlp.down_proj], packed)[0]
        self.act = mlp.act_fn
        self.q_width, self.kv_width = attention.q_proj.out_features, attention.k_proj.out_features
        self.intermediate = mlp.gate_proj.out_features


def _products(linears: list[nn.Linear], packed: bool) -> list[_Product]:
    if packed:
        return [_Product([linear.weight for linear in linears], [linear.bias for linear in linears], True)]
    return [_Product([linear.weight], [linear.bias], False) for linear in linears]


def _norm_of(module: nn.Module) -> tuple[torch.Tensor, float]:
    return module.weight, module.variance_epsilon


def _rms_norm(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """transformers' Llama RMSNorm (``weight · (x / rms(x))`` in fp32, cast back before the weight) in one kernel."""
    weight, eps = norm
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [R, heads, 1, d]`` rotated as transformers' ``apply_rotary_pos_emb`` does (``cos``/``sin [R, 1, 1, d]``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class DecodeStep:
    """``tokens [R, 1]`` at ``positions [R, 1]`` → next-token logits ``[R, V]`` (compute dtype), appending this step's
    keys and values to ``cache`` (per layer ``[keys, values]``, each ``[R, H_kv, L, d]``).

    Build it where ``model``'s parameters are the tensors its forward computes with (gathered, in the compute
    dtype: :func:`hybridrl.modeling.single_rank.compute_parameters_in_place`); it keeps them (and packed copies)
    until dropped, so build one per ``generate``. ``prepack=False``: plain products (for A/B checks).
    """

    def __init__(self, model: nn.Module, prepack: bool = True) -> None:
        reason = fast_decode_unsupported(model)
        if reason is not None:
            raise ValueError(f"the fast decode step cannot run this model: {reason}")
        inner = model.model
        self.embedding = inner.embed_tokens.weight
        if type(self.embedding) not in (torch.Tensor, nn.Parameter):  # a DTensor: not gathered
            raise ValueError("the fast decode step needs gathered parameters (FSDP2 shards are DTensors)")
        packed = prepack and self.embedding.device.type == "cpu" and prepacking_available(self.embedding.dtype)
        self.rotary = inner.rotary_emb
        self.layers = [_Layer(layer, packed) for layer in inner.layers]
        self.final_norm = _norm_of(inner.norm)
        self.head = _Product([model.lm_head.weight], [None], packed)
        attention = inner.layers[0].self_attn
        self.head_dim = attention.head_dim

    @staticmethod
    def cache_from(past_key_values) -> list[list[torch.Tensor]]:
        """A transformers ``DynamicCache``'s keys and values, per layer (the tensors themselves, not copies)."""
        return [[layer.keys, layer.values] for layer in past_key_values.layers]

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor,
                 cache: list[list[torch.Tensor]]) -> torch.Tensor:
        """``attend [R, L]``: which of the ``L`` keys (the cache's and this token's) each row sees."""
        hidden = F.embedding(tokens, self.embedding)
        cos, sin = self.rotary(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = attend.bool()[:, None, None, :]
        for layer, layer_cache in zip(self.layers, cache):
            hidden = hidden + self._attention(layer, _rms_norm(hidden, layer.input_norm), cos, sin, mask, layer_cache)
            hidden = hidden + self._mlp(layer, _rms_norm(hidden, layer.post_norm))
        return self.head(_rms_norm(hidden[:, -1], self.final_norm))

    def _attention(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                   layer_cache: list[torch.Tensor]) -> torch.Tensor:
        rows = x.shape[0]
        if len(layer.qkv) == 1:
            q, k, v = layer.qkv[0](x).split([layer.q_width, layer.kv_width, layer.kv_width], dim=-1)
        else:
            q, k, v = (product(x) for product in layer.qkv)
        q, k, v = (t.view(rows, 1, -1, self.head_dim) for t in (q, k, v))
        if layer.q_norm is not None:
            q, k = _rms_norm(q, layer.q_norm), _rms_norm(k, layer.k_norm)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        layer_cache[0] = torch.cat([layer_cache[0], _rotated(k, cos, sin)], dim=2)
        layer_cache[1] = torch.cat([layer_cache[1], v], dim=2)
        out = direct_attention(_rotated(q, cos, sin), layer_cache[0], layer_cache[1], mask, scaling=layer.scaling)
        return layer.o(out.reshape(rows, 1, -1))

    @staticmethod
    def _mlp(layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        if len(layer.gate_up) == 1:
            gate, up = layer.gate_up[0](x).split(layer.intermediate, dim=-1)
        else:
            gate, up = (product(x) for product in layer.gate_up)
        return layer.down(layer.act(gate) * up)

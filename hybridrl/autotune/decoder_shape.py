"""The sizes of a decoder that memory and time depend on, read from a Hugging Face config — dense (Llama-style:
gated MLP) or mixture-of-experts (Mixtral, Qwen2-MoE, Qwen3-MoE: every expert's weights are held, ``k`` of them
compute per token).

A mixture-of-experts layer holds ``E`` experts of width ``I_e`` (``3·h·I_e`` parameters each), a router ``[E, h]``
and, in Qwen2-MoE, a shared expert of width ``I_s`` with its gate ``[1, h]``; a token runs through ``k`` experts
(``num_experts_per_tok``) and the shared one, so its MLP is ``k·I_e + I_s`` wide (:attr:`active_intermediate_size`:
what activations and FLOPs follow). Qwen's ``decoder_sparse_step`` / ``mlp_only_layers`` leave some layers dense.
Another MoE layout (DeepSeek's ``n_routed_experts``, …) is refused by name rather than counted as dense.
"""

from __future__ import annotations

from dataclasses import dataclass

MOE_HINTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_intermediate_size", "n_shared_experts")
"""Config attributes that say a model has experts (one of them set and > 0)."""


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of a decoder that memory depends on (from a Hugging Face config)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    """RMSNorm over each head's queries and keys (Qwen3): ``2·head_dim`` weights a layer."""
    num_experts: int = 0
    """Routed experts of a sparse layer (0: a dense model)."""
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    num_sparse_layers: int = 0
    """Layers whose MLP is the experts; the others are dense (``intermediate_size``)."""

    @classmethod
    def from_hf_config(cls, config) -> "DecoderShape":
        """From a ``LlamaConfig``/``Qwen2Config``-like config (Qwen2 has q/k/v biases, Qwen3 q/k norms), or
        Mixtral / Qwen2-MoE / Qwen3-MoE; a ``ValueError`` for a decoder this model does not describe (no gated MLP,
        e.g. GPT-2, or experts laid out another way)."""
        if getattr(config, "intermediate_size", None) is None:
            raise ValueError(f"the memory model covers Llama-style decoders (gated MLP, intermediate_size); the "
                             f"model's config (model_type={getattr(config, 'model_type', None)!r}) has no "
                             "intermediate_size")
        heads = config.num_attention_heads
        dense = dict(num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
                     intermediate_size=config.intermediate_size, num_heads=heads,
                     num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                     head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                     vocab_size=config.vocab_size, tie_word_embeddings=bool(config.tie_word_embeddings),
                     qkv_bias=config.model_type in ("qwen2", "qwen2_moe")
                     or bool(getattr(config, "attention_bias", False)),
                     qk_norm=config.model_type in ("qwen3", "qwen3_moe"))
        return cls(**dense, **_experts_of(config))

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_sparse_layers > 0

    @property
    def active_intermediate_size(self) -> int:
        """The MLP width one token runs through (a sparse layer's ``k·I_e + I_s`` when the model has experts)."""
        if not self.is_moe:
            return self.intermediate_size
        return self.experts_per_token * self.expert_intermediate_size + self.shared_expert_intermediate_size

    def attention_tensors(self) -> list[tuple[int, int]]:
        """``(rows, columns)`` of each attention weight of a layer and its two RMSNorm weights (a vector is
        ``(length, 1)``): q/k/v/o projections, Qwen2's q/k/v biases, Qwen3's per-head q/k norms."""
        h, q, kv, d = self.hidden_size, self.q_width, self.kv_width, self.head_dim
        tensors = [(q, h), (kv, h), (kv, h), (h, q), (h, 1), (h, 1)]
        if self.qkv_bias:
            tensors += [(q, 1), (kv, 1), (kv, 1)]
        if self.qk_norm:
            tensors += [(d, 1), (d, 1)]
        return tensors

    def mlp_tensors(self, sparse: bool) -> list[tuple[int, int]]:
        """A dense layer's gate/up/down projections, or a sparse layer's router ``[E, h]``, its experts as
        transformers holds them (``gate_up_proj [E, 2·I_e, h]``, ``down_proj [E, h, I_e]``: ``E`` rows each), the
        shared expert and its gate."""
        h = self.hidden_size
        if not sparse:
            return [(self.intermediate_size, h), (self.intermediate_size, h), (h, self.intermediate_size)]
        experts, width, shared = self.num_experts, self.expert_intermediate_size, self.shared_expert_intermediate_size
        tensors = [(experts, h), (experts, 2 * width * h), (experts, h * width)]
        if shared:
            tensors += [(shared, h), (shared, h), (h, shared)]
        if self.shared_expert_gate:
            tensors.append((1, h))
        return tensors

    def layer_tensors(self, sparse: bool) -> list[tuple[int, int]]:
        """Every weight of one decoder layer as ``(rows, columns)``: what FSDP2 shards along its rows."""
        return self.attention_tensors() + self.mlp_tensors(sparse)

    def root_tensors(self, head: str = "lm") -> list[tuple[int, int]]:
        """The weights outside the layers (FSDP2's root group): embedding, final norm and the head — an untied LM head
        ``[V, h]`` (``head="lm"``), or a value/reward model's scalar head ``[1, h]`` with its bias (``"value"``)."""
        h = self.hidden_size
        tensors = [(self.vocab_size, h), (h, 1)]
        if head == "value":
            return tensors + [(1, h), (1, 1)]
        return tensors + ([] if self.tie_word_embeddings else [(self.vocab_size, h)])

    def layer_parameters(self) -> int:
        """Parameters of the largest decoder layer (attention projections, MLP or experts, two RMSNorm weights):
        what one layer's all-gather holds at once."""
        return tensor_elements(self.layer_tensors(self.is_moe))

    def root_parameters(self) -> int:
        """Parameters outside the layers (FSDP2's root group): embedding, final norm, untied LM head."""
        return tensor_elements(self.root_tensors())

    def num_parameters(self) -> int:
        """Every parameter the model holds (every expert included)."""
        sparse = self.num_sparse_layers if self.is_moe else 0
        dense_layer = tensor_elements(self.layer_tensors(sparse=False))
        return sparse * self.layer_parameters() + (self.num_layers - sparse) * dense_layer + self.root_parameters()


def tensor_elements(tensors: list[tuple[int, int]], shard_group: int = 1) -> int:
    """Elements of ``tensors`` (``(rows, columns)`` pairs) once each one's rows are padded to a multiple of
    ``shard_group`` — FSDP2 shards every parameter along dim 0 in equal pieces, and its all-gathers and
    reduce-scatters carry the padding."""
    return sum(-(-rows // shard_group) * shard_group * columns for rows, columns in tensors)


def _experts_of(config) -> dict:
    """The expert fields of :class:`DecoderShape` for Mixtral / Qwen2-MoE / Qwen3-MoE; ``{}`` for a dense model."""
    model_type = getattr(config, "model_type", None)
    if not any((getattr(config, name, None) or 0) > 0 for name in MOE_HINTS if
               isinstance(getattr(config, name, None), int)):
        return {}
    if model_type == "mixtral":
        return dict(num_experts=config.num_local_experts, experts_per_token=config.num_experts_per_tok,
                    expert_intermediate_size=config.intermediate_size, num_sparse_layers=config.num_hidden_layers)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step, dense_only = getattr(config, "decoder_sparse_step", 1) or 1, set(getattr(config, "mlp_only_layers", []))
        sparse = sum(1 for layer in range(config.num_hidden_layers)
                     if layer not in dense_only and (layer + 1) % step == 0)
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        return dict(num_experts=config.num_experts, experts_per_token=config.num_experts_per_tok,
                    expert_intermediate_size=config.moe_intermediate_size, shared_expert_intermediate_size=shared,
                    shared_expert_gate=shared > 0, num_sparse_layers=sparse)
    raise ValueError(f"model_type={model_type!r} has experts laid out in a way the memory model does not count "
                     "(it counts Mixtral, Qwen2-MoE and Qwen3-MoE); planning it as a dense model would leave the "
                     "experts' weights out")

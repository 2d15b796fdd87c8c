"""Step time before any step is run: a roofline model (each phase takes the longer of its FLOPs at the device's peak
and its bytes at the device's memory bandwidth, divided by an efficiency factor), and the cost of the run.

FLOPs of a forward over a sequence of ``T`` tokens: ``T · (2·M + 2·L·q·T)`` — ``M`` matmul parameters (the layers and
the LM head; the embedding is a lookup) and causal attention (QKᵀ and AV at an average context of ``T/2``). A
training micro-step is forward + backward = 3× that (4× with activation checkpointing, which recomputes the forward).
Generation is prefill (compute-bound) plus one decode step per response token, each reading this device's share of
the weights and of the KV cache (bandwidth-bound at RL batch sizes on small models, compute-bound on large batches).
All sequences are taken at the maximum prompt and response lengths: an upper bound when responses end early.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from hybridrl.config.precision import DTYPE_BYTES
from hybridrl.config.schema import TrainConfig
from hybridrl.config.rollout_placement import generation_devices
from hybridrl.config.sizes import trained_rows_per_prompt, world_size
from hybridrl.config.validation import critic_enabled
from hybridrl.planner.hardware import GpuSpec
from hybridrl.planner.memory_plan import MemoryPlan, kv_bytes_per_token
from hybridrl.autotune.memory_sizing import DecoderShape

DEFAULT_EFFICIENCY = 0.4


def matmul_parameters(shape: DecoderShape, with_lm_head: bool = True) -> int:
    """Weights that take part in a matmul per token: the layers' projections and the LM head (not the embedding
    lookup, norm weights or biases)."""
    h, q, kv = shape.hidden_size, shape.q_width, shape.kv_width
    layer = 2 * h * q + 2 * h * kv + 3 * h * shape.active_intermediate_size
    return shape.num_layers * layer + (shape.vocab_size * h if with_lm_head else 0)


def forward_flops(shape: DecoderShape, tokens: int, *, with_lm_head: bool = True) -> float:
    """FLOPs of one causal forward over a sequence of ``tokens`` tokens (module docstring)."""
    attention = 2 * shape.num_layers * shape.q_width * tokens
    return tokens * (2.0 * matmul_parameters(shape, with_lm_head) + attention)


@dataclass(frozen=True)
class StepTime:
    """Seconds per phase of one step on every device (they run data-parallel), at ``efficiency`` of the peaks."""

    phases: dict[str, float]
    efficiency: float

    @property
    def total(self) -> float:
        return sum(self.phases.values())


def generation_seconds(config: TrainConfig, shape: DecoderShape, gpu: GpuSpec, waves: int = 1) -> float:
    """Prefill + decode of this device's sequences at peak (before the efficiency factor). ``waves``: how many times
    the engine must cycle because its KV cache holds only part of the batch (each wave re-reads the weights)."""
    c = DTYPE_BYTES[config.model.dtype]
    tp = config.rollout.tensor_model_parallel_size
    engines = rollout_engines(config)
    rows = config.data.train_batch_size * config.rollout.n / engines
    prompt, response = config.data.max_prompt_length, config.data.max_response_length
    prefill = rows * forward_flops(shape, prompt) / (tp * gpu.bf16_flops)
    context = prompt + response / 2
    per_step_flops = rows * (2.0 * matmul_parameters(shape) + 4 * shape.num_layers * shape.q_width * context)
    kv_per_token = 2 * shape.num_layers * shape.kv_width * c
    per_step_bytes = (waves * c * shape.num_parameters() + rows * context * kv_per_token) / tp
    decode = response * max(per_step_flops / (tp * gpu.bf16_flops), per_step_bytes / gpu.bandwidth)
    return prefill + decode


def roofline_step_time(config: TrainConfig, shape: DecoderShape, gpu: GpuSpec, *,
                       efficiency: float = DEFAULT_EFFICIENCY, waves: int = 1) -> StepTime:
    """Seconds of each phase of one training step (module docstring)."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    devices = world_size(config)
    sequences = config.data.train_batch_size * trained_rows_per_prompt(config)  # rows the forwards and update see
    seq_len = config.data.max_prompt_length + config.data.max_response_length
    forward = sequences * forward_flops(shape, seq_len)
    value_forward = sequences * forward_flops(shape, seq_len, with_lm_head=False)
    train_peak = gpu.fp8_flops if (config.model.fp8_compute and gpu.supports_fp8) else gpu.bf16_flops
    passes = 4 if config.model.enable_gradient_checkpointing else 3
    phases = {"generate": generation_seconds(config, shape, gpu, waves)}
    log_prob_passes = 1 + (config.actor.use_kl_loss or config.algorithm.use_kl_in_reward)
    log_probs = log_prob_passes * forward + (value_forward if critic_enabled(config) else 0.0)
    if config.reward_model.enable:
        log_probs += value_forward
    phases["log_probs"] = log_probs / (devices * gpu.bf16_flops)
    if critic_enabled(config):
        phases["update_critic"] = passes * config.critic.ppo_epochs * value_forward / (devices * train_peak)
    phases["update_actor"] = passes * config.actor.ppo_epochs * forward / (devices * train_peak)
    if config.rollout.name == "vllm":  # weights copied into the engine: one read and one write of the compute copy
        phases["weight_sync"] = 2 * DTYPE_BYTES[config.model.dtype] * shape.num_parameters() / gpu.bandwidth
    return StepTime({name: seconds / efficiency for name, seconds in phases.items()}, efficiency)


def rollout_engines(config: TrainConfig) -> int:
    """Generation replicas: a standalone pool's (``rollout.n_gpus / t_g``), or the actor's devices' (``N / t_g``)."""
    return generation_devices(config) // config.rollout.tensor_model_parallel_size


def job_devices(config: TrainConfig) -> int:
    """Every device the job holds: the trainer's, a standalone rollout pool's and a reward model's own."""
    reward_model = config.reward_model.n_gpus if config.reward_model.enable else 0
    return world_size(config) + config.rollout.n_gpus + reward_model


def run_cost(hours: float, num_devices: int, price_per_gpu_hour: float) -> float:
    """Price of ``hours`` of wall time on ``num_devices`` GPUs (``hours`` already include the efficiency factor:
    roofline hours at peak ÷ efficiency, or measured hours)."""
    return price_per_gpu_hour * num_devices * hours


def generation_waves(config: TrainConfig, shape: DecoderShape, plan: MemoryPlan) -> float:
    """How many passes vLLM needs because its KV cache (``plan``: a :class:`~hybridrl.planner.memory_plan.
    MemoryPlan`) holds only part of this device's sequences (1 for HF, whose cache is sized for the whole batch);
    ``math.inf`` when it cannot hold one sequence: the engine cannot generate at all."""
    rollout = plan.roles["rollout"]
    if config.rollout.name != "vllm":
        return 1
    tp = config.rollout.tensor_model_parallel_size
    capacity = rollout.kv_cache // kv_bytes_per_token(shape, DTYPE_BYTES[config.model.dtype], tp)
    sequence = config.data.max_prompt_length + config.data.max_response_length
    if capacity < sequence:
        return math.inf
    tokens = config.data.train_batch_size * config.rollout.n * sequence // rollout_engines(config)
    return max(1, -(-tokens // capacity))

"""The configuration schema: dataclasses are the source of truth; YAML in ``conf/`` only selects and overrides.

Every field carries an attribute docstring (the string right under it); ``hybridrl.config.docs`` turns them into the
config reference, and a test fails if a field has none. Key names follow verl's where the concept is the same.

Batch-size vocabulary (docs/architecture.md §3): *algorithm* sizes are global and counted in **prompts**
(``data.train_batch_size``, ``actor.ppo_mini_batch_size``); *performance* sizes are per device and counted in
**sequences** (``*_micro_batch_size_per_gpu``) or tokens (``*_max_token_len_per_gpu``). Derived sizes live in
``hybridrl.config.sizes`` and are never written back into the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from hybridrl.config.algorithm_schema import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, OverlongBufferConfig
from hybridrl.config.anti_forgetting_schema import EWCConfig, PtxConfig, ReplayConfig
from hybridrl.config.frozen import FreezableConfig
from hybridrl.config.faults import FaultInjectionConfig
from hybridrl.config.monitoring import MonitoringConfig
from hybridrl.config.async_schema import AsyncTrainingConfig
from hybridrl.config.health import HealthConfig
from hybridrl.config.ray import RayConfig
from hybridrl.config.reward_schema import (CustomRewardConfig, RewardFusionConfig, RewardJudgeConfig,
                                           RewardModelConfig)
from hybridrl.config.rollout_schema import RolloutConfig


@dataclass
class LoraConfig(FreezableConfig):
    rank: int = 0
    """LoRA rank r of the actor's adapters (PEFT); 0 trains the full model. With LoRA the reference policy is the
    base model with the adapters disabled (no second copy), and the rollout engine receives the merged weights."""
    alpha: float = 16.0
    """LoRA alpha: the adapter update is scaled by ``alpha / rank``."""
    dropout: float = 0.0
    """Dropout on the adapters' input during training, in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])
    """Leaf names of the linear layers that get adapters (``["all-linear"]`` = every linear layer but the LM head)."""


@dataclass
class ModelConfig(FreezableConfig):
    path: str = ""
    """Required: a local Hugging Face model directory (config + safetensors). Nothing is ever downloaded at run time."""
    tokenizer_path: Optional[str] = None
    """Tokenizer directory; ``null`` means the same as ``model.path``."""
    dtype: str = "auto"
    """Compute dtype of forward/backward passes: ``auto`` | ``float32`` | ``bfloat16`` | ``float16``. Master weights
    stay fp32. ``auto``: bf16 on accelerators and on CPUs with native bf16 (AVX-512 BF16 / AMX), fp32 on other CPUs
    (where bf16 matmuls are emulated, ~100× slower) and under an ``ONEDNN_MAX_CPU_ISA`` below ``AVX512_CORE_BF16`` —
    decided when the config is validated and said in one log line."""
    attn_implementation: str = "auto"
    """``auto`` | ``sdpa`` | ``eager`` | ``flex_attention`` | ``flash_attention_2`` (GPU with flash-attn installed
    only). ``auto``: on GPU flash-attn 2 when installed and the dtype is bf16/fp16, else ``sdpa``; on CPU direct
    matmul-softmax attention for short sequences (query × key ≤ 192², where it is 1.5–6× faster than CPU sdpa) and
    ``sdpa`` for longer ones (``hybridrl.modeling.attention``)."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30 % more compute)."""
    use_remove_padding: bool = False
    """Pack micro-batches without pad tokens (per-sequence position ids); outputs equal the padded computation."""
    share_prompts: bool = True
    """Padded micro-batches (``use_remove_padding=false``): run the responses to one prompt (``rollout.n`` > 1) as
    one row over a single copy of the prompt, each response seeing the prompt and itself only — the same outputs and
    gradients with the prompt computed once. Used per micro-batch when its estimated FLOPs are lower (short
    responses; long ones stay padded) and the attention takes custom masks (eager, sdpa, the CPU kernel; not
    flash-attn 2 or flex attention)."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model directory. Off by default: it executes that code."""
    use_torch_compile: bool = False
    """Compile each decoder layer with ``torch.compile`` (training roles); the first steps are slower while it compiles."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on the actor (``lora.rank > 0`` turns them on; needs ``pip install 'hybridrl[lora]'``)."""
    fp8_compute: bool = False
    """Run the decoder's linear layers in float8 (torchao float8 training) in the training roles: Hopper GPUs
    (compute capability >= 9.0) only, refused elsewhere. Master weights stay fp32."""
    use_fused_kernels: bool = False
    """Actor and reference log-probs with the LM head fused into the log-softmax, chunk by chunk: no
    ``[tokens, vocab]`` logits are kept (with a 150k vocabulary and 8k scored tokens, ≈ 12 GB fewer at the peak),
    for the head's matmul once more in backward (a third more of the head's FLOPs). Same numbers within rounding.
    verl's ``actor_rollout_ref.model.use_fused_kernels``. Causal LMs with a bias-free head whose type returns the
    head's output unchanged (``hybridrl.modeling.scored_head.PASS_THROUGH_MODEL_TYPES``); others are refused. With it
    off, such models still run the head on the scored positions alone, as a plain matmul."""


@dataclass
class OptimConfig(FreezableConfig):
    lr: float = 1e-6
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    lr_warmup_steps: int = 0
    """Linear warm-up steps (optimizer steps). Takes precedence over ``lr_warmup_steps_ratio`` when > 0 (0, or verl's
    -1: use the ratio)."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up as a fraction of the total optimizer steps, used when ``lr_warmup_steps`` is 0."""
    lr_scheduler: str = "constant"
    """After warm-up: ``constant`` | ``cosine``."""
    min_lr_ratio: float = 0.0
    """Cosine schedule floor, as a fraction of ``lr``."""
    state_precision: str = "fp32"
    """AdamW moments: ``fp32`` (8 bytes per parameter) | ``8bit`` (block-quantised, ~2 bytes; torchao, or
    bitsandbytes on CUDA; ``pip install 'hybridrl[lowbit]'``). Master weights and gradients stay fp32."""


@dataclass
class FSDPConfig(FreezableConfig):
    param_offload: bool = False
    """Keep parameters on CPU between uses (FSDP2 ``CPUOffloadPolicy``)."""
    optimizer_offload: bool = False
    """Keep the optimizer state on the host while the role is idle, on the device for its own updates: the
    actor's leaves for each generation, the critic's after each critic update (so generation, the forwards and the
    actor's update have its memory). Exact: the same numbers, one host round trip of 8 bytes per parameter shard per
    step. No effect on CPU workers."""
    reshard_after_forward: bool = True
    """FSDP2 ``reshard_after_forward``: free gathered parameters after forward (ZeRO-3) or keep them (ZeRO-2)."""
    reduce_dtype: str = "float32"
    """Dtype of the gradient reduce-scatter: ``float32`` (exact accumulation) or ``bfloat16``."""
    fsdp_size: int = -1
    """Ranks one copy of the model is sharded over (HSDP): shard within groups of ``fsdp_size`` consecutive ranks and
    replicate across groups, so all-gathers and reduce-scatters stay in a group (e.g. one node's NVLink) and one
    all-reduce of each gradient shard crosses groups; each rank holds 1/``fsdp_size`` of the model instead of
    1/world. ``-1``: all ranks (plain FSDP2). Must divide the role's ranks; data parallelism still spans them all."""
    gather_once: Union[bool, str] = "auto"
    """All-gather the parameters once per optimizer step (and once per log-prob or value pass) and keep them through
    its micro-batches, instead of twice per micro-batch (forward, and again in backward). Costs one unsharded copy
    of the parameters in the compute dtype for the duration, like ZeRO-2. ``auto``: on for CPU workers (gloo
    all-gathers are slow, memory is plentiful) and on a single GPU (nothing to gather: per-layer groups only add work
    to every micro-batch), off on several GPUs (FSDP2 overlaps the all-gathers with compute). On one rank (without
    ``param_offload``, with ``reduce_dtype: float32``) it skips FSDP2 altogether: the fp32 weights are cast to the
    compute dtype once per step or pass and gradients accumulate in fp32, the same numbers bit for bit with less
    per-forward work."""
    grad_sync: str = "step"
    """When gradient accumulation reduce-scatters gradients. ``step``: once per optimizer step (on the last
    micro-batch); between micro-batches FSDP2 keeps the *unsharded* gradients of the whole model in
    ``reduce_dtype`` — 4 bytes per parameter on every rank (28 GiB for a 7B model in fp32), whatever the number of
    ranks. ``micro_batch``: after every micro-batch, so each rank keeps only its shard (4 bytes per parameter ÷
    ranks: 3.5 GiB for 7B on 8 GPUs) at the price of K reduce-scatters of the whole gradient per step instead of
    one (K = accumulation steps; each moves ≈ 4 bytes per parameter per rank, overlapped with the backward — cheap
    on NVLink, felt over slower links). Same update either way; no difference with one micro-batch or one rank.
    With HSDP (``fsdp_size``) the all-reduce across groups runs once per optimizer step either way, unless
    ``defer_all_reduce`` is off."""
    defer_all_reduce: bool = True
    """HSDP with ``grad_sync: micro_batch``: all-reduce the gradients across shard groups (typically across nodes)
    once per optimizer step, keeping the earlier micro-batches' reduced shards in one shard-sized buffer in
    ``reduce_dtype`` until then (FSDP2's ``set_requires_all_reduce``). ``false``: after every micro-batch, without
    the buffer — K times the cross-group traffic for 4 bytes per parameter ÷ ``fsdp_size`` less memory (what fits a
    7B critic with parameter offload on a 24 GB GPU). The same sum either way, in another order."""


@dataclass
class MicroBatchSizingConfig(FreezableConfig):
    memory_budget_mb: Optional[int] = None
    """Memory (MiB) one rank may use for this role's training when ``ppo_micro_batch_size_per_gpu: auto``.
    ``null`` = on CUDA, what the process can allocate at start-up (free + its own reserved memory, the least over
    ranks), compared with a measured forward/backward; required on CPU, where it is compared with the analytic model
    of this role's model states and activations (``hybridrl.autotune.memory_sizing``)."""
    headroom: float = 0.15
    """Fraction of the budget kept free (allocator caching, fragmentation, kernel workspaces); 0.10–0.20 is usual."""


LR_SCALING_EXPONENTS = {"linear": 1.0, "sqrt": 0.5, "none": 0.0}
"""``actor.adaptive_accumulation.lr_scaling`` → the exponent ``p`` of the learning-rate rule ``(K / K_ref)^p``."""
LR_SCALINGS = tuple(LR_SCALING_EXPONENTS)


@dataclass
class AdaptiveAccumulationConfig(FreezableConfig):
    enable: bool = False
    """Move the actor's gradient-accumulation steps between updates so the mini-batch follows the measured gradient
    noise scale B_simple (turns the noise-scale measurement on). Fixed micro-batches only."""
    min_steps: int = 1
    """Fewest accumulation steps per optimizer step (>= 2 on a single rank: the noise scale needs two batch sizes)."""
    max_steps: int = 16
    """Most accumulation steps per optimizer step; steps are ``min_steps × 2^k`` (and the configured count) that
    divide the rank's sequences of one training step."""
    lr_scaling: str = "sqrt"
    """Learning rate at K steps = configured lr × (K / configured steps)^p: ``sqrt`` (p = 1/2, Adam-family),
    ``linear`` (p = 1, SGD-style), ``none`` (p = 0). The schedule advances by samples, not optimizer steps."""
    tolerance: float = 2.0
    """Hysteresis: keep the steps while B_simple is within this factor of the current mini-batch (>= 1)."""
    min_updates: int = 10
    """Optimizer steps of noise-scale estimates before the first change."""


ROUTER_REPLAY_MODES = ("disabled", "record", "R3")
"""``actor.router_replay.mode`` values (docs/training.md, "MoE routing replay")."""


@dataclass
class RouterReplayConfig(FreezableConfig):
    mode: str = "disabled"
    """Mixture-of-experts routing replay. ``R3``: the rollout records the experts each token was routed to and the
    actor's forwards (old log-probs and every update) route each token to those experts, with the trainer's own
    router probabilities as gate weights, so the probability trained is the one sampled (the reference policy routes
    on its own). ``record``: the rollout records and the actor routes on its own, reporting how often its routers
    chose the same experts (``actor/routing_agreement``). ``disabled``: neither. Needs an MoE model (Mixtral-,
    Qwen3-MoE-style top-k routers) and ``rollout.name=hf`` (the vLLM path does not return routed experts yet)."""


@dataclass
class ActorConfig(FreezableConfig):
    strategy: str = "fsdp2"
    """Training backend. Only ``fsdp2`` for now."""
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step (global). Each prompt brings ``rollout.n`` responses; split over DP ranks inside the worker."""
    ppo_micro_batch_size_per_gpu: Optional[Union[int, str]] = 4
    """Sequences per forward/backward on one device, or ``auto``: the largest that fits ``micro_batch_sizing``'s
    budget at the longest sequence, chosen at worker start-up. Ignored when ``use_dynamic_bsz`` is true."""
    use_dynamic_bsz: bool = False
    """Form micro-batches by a token budget (``ppo_max_token_len_per_gpu``) instead of a fixed sequence count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one micro-batch on one device when ``use_dynamic_bsz`` is true."""
    ulysses_sequence_parallel_size: int = 1
    """Ranks that split every sequence between them (Ulysses sequence parallelism, verl's key): between layers each
    holds ``1/SP`` of the positions, and attention exchanges positions for heads with an all-to-all, so activations
    shrink ``SP`` times and long responses fit. Must divide the actor's ranks and the model's attention heads. The
    data-parallel size becomes ``ranks / SP`` (``ppo_mini_batch_size`` and the micro-batch identity use it), and a
    token budget (``ppo_max_token_len_per_gpu``) counts the whole sequences of ``SP`` ranks, ``SP ×`` the budget.
    The reference policy splits as the actor does. Exact: the gradients are those of whole sequences."""
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per forward in ``compute_log_prob`` (no gradients, so it can be larger); ``null`` = the PPO micro-batch."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per training step."""
    old_log_prob: str = "auto"
    """``auto``: skip the old-log-prob forward when the update is exactly on-policy — one PPO epoch over one
    mini-batch (``ppo_mini_batch_size == data.train_batch_size``), no KL in the reward, no adaptive accumulation —
    and use the update's own log-probs, detached, as the old ones: the ratio is 1 by construction and the gradient
    the same, for one forward pass less per step. ``recompute``: always run it (it also logs
    ``rollout/log_prob_diff_*``, the check that the rollout engine's weights match the actor's)."""
    shuffle: bool = True
    """Shuffle sequences before forming mini-batches (seeded by ``trainer.seed`` and the step)."""
    policy_loss: str = "vanilla"
    """Policy loss: ``vanilla`` (PPO clip, dual clip) | ``gspo`` | ``cispo``."""
    loss_agg_mode: str = "token-mean"
    """``token-mean`` | ``seq-mean-token-sum`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum-norm``; always normalised globally."""
    clip_ratio_low: float = 0.2
    """Lower PPO clip: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """Upper PPO clip: ratio <= 1 + clip_ratio_high (DAPO's clip-higher uses e.g. 0.28)."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (must be > 1)."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient (0 disables the entropy term in the loss; entropy is still logged)."""
    use_kl_loss: bool = False
    """Add KL(policy || reference) as a loss term (GRPO style) instead of, or besides, KL in the reward."""
    kl_loss_coef: float = 0.001
    """Coefficient of the KL loss term."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the loss term: ``k1``/``kl`` | ``abs`` | ``k2``/``mse`` | ``k3``/``low_var_kl``."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; a non-finite norm skips the step."""
    log_grad_noise_scale: bool = False
    """Estimate the gradient noise scale B_simple (McCandlish et al. 2018) from the micro-batch gradients and log it
    as ``actor/grad_noise/*`` (needs >= 2 micro-batches or ranks per step; one extra norm per micro-batch)."""
    micro_batch_sizing: MicroBatchSizingConfig = field(default_factory=MicroBatchSizingConfig)
    """Memory budget and headroom of ``ppo_micro_batch_size_per_gpu: auto``."""
    adaptive_accumulation: AdaptiveAccumulationConfig = field(default_factory=AdaptiveAccumulationConfig)
    """Accumulation steps that follow the gradient noise scale (off by default)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding and offload settings."""
    ptx: PtxConfig = field(default_factory=PtxConfig)
    """PPO-ptx: an SFT loss term mixed into every update (anti-forgetting; off while ``ptx.coef`` is 0)."""
    ewc: EWCConfig = field(default_factory=EWCConfig)
    """EWC: a pull towards the starting weights, weighted by a diagonal Fisher (off while ``ewc.coef`` is 0)."""
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    """MoE routing replay (R3): train with the experts the rollout routed each token to (off by default)."""
    freeze_vision_tower: bool = False
    """A vision-language policy: keep its vision tower (the image encoder and its merger) at its starting weights and
    train the language model only (verl's key). Refused for a text-only model."""


@dataclass
class ReferenceConfig(FreezableConfig):
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """Sequences per reference forward on one device; ``null`` = ``actor.log_prob_micro_batch_size_per_gpu``."""
    param_offload: bool = False
    """Keep reference parameters on CPU between uses."""


@dataclass
class CriticConfig(FreezableConfig):
    enable: Optional[bool] = None
    """Train a value model. ``null`` = automatic: on for ``gae``, off for critic-free estimators."""
    model_path: Optional[str] = None
    """Value-model initialisation; ``null`` = ``model.path`` (a fresh value head on the policy backbone)."""
    ppo_mini_batch_size: int = 16
    """Prompts per critic optimizer step (global), as for the actor."""
    ppo_micro_batch_size_per_gpu: Optional[Union[int, str]] = 4
    """Sequences per critic forward/backward on one device, or ``auto`` (sized from memory, as for the actor)."""
    use_dynamic_bsz: bool = False
    """Token-budget micro-batches for the critic."""
    ppo_max_token_len_per_gpu: int = 16384
    """Critic token budget per micro-batch when ``use_dynamic_bsz`` is true."""
    ulysses_sequence_parallel_size: int = 1
    """Ranks that split every sequence between them for the critic (as ``actor.ulysses_sequence_parallel_size``)."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per critic update."""
    cliprange_value: float = 0.5
    """Value clipping range around the old values."""
    loss_agg_mode: str = "token-mean"
    """Aggregation of the value loss (same modes as the actor)."""
    grad_clip: float = 1.0
    """Clip the critic's global gradient norm."""
    micro_batch_sizing: MicroBatchSizingConfig = field(default_factory=MicroBatchSizingConfig)
    """Memory budget and headroom of ``ppo_micro_batch_size_per_gpu: auto`` (the analytic model on every device)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Critic optimizer."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """Critic FSDP2 settings."""


@dataclass
class DataConfig(FreezableConfig):
    train_files: list[str] = field(default_factory=list)
    """Parquet or JSONL files with verl's schema (``data_source``, ``prompt``, ``reward_model.ground_truth``, ``extra_info``)."""
    val_files: list[str] = field(default_factory=list)
    """Validation files, same schema."""
    synthetic_task: Optional[str] = None
    """Generate prompts on the fly instead of reading files, e.g. ``arithmetic`` (used by the demo and tests)."""
    synthetic_task_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options of the synthetic task, e.g. ``{max_digits: 2, operators: "+"}`` (see ``hybridrl.data.synthetic``)."""
    prompt_key: str = "prompt"
    """Column holding the prompt (chat messages or plain text)."""
    image_key: str = "images"
    """Column holding a row's images (verl's layout): a list of image bytes, file paths or ``{"bytes", "path"}``
    dicts, one per ``<image>`` in the prompt, in order. Rows with images need a vision-language policy
    (Qwen2-VL-class, with its image processor saved beside it); absent or empty: a text-only row."""
    max_prompt_length: int = 512
    """Prompt tokens after the chat template; longer prompts follow ``truncation`` / ``filter_overlong_prompts``."""
    max_response_length: int = 512
    """Maximum generated tokens per response."""
    train_batch_size: int = 64
    """Prompts per training step (global)."""
    gen_batch_size: Optional[int] = None
    """Prompts per generation batch with dynamic sampling (``algorithm.filter_groups``, DAPO's ``gen_batch_size``):
    each batch of this many prompts is generated and filtered until ``train_batch_size`` informative groups are
    collected. ``null`` = ``train_batch_size``. Without the filter it must be null or equal ``train_batch_size``."""
    val_batch_size: Optional[int] = None
    """Prompts per validation generation call; ``null`` = ``train_batch_size`` (bounded memory on large sets)."""
    truncation: str = "error"
    """Over-long prompts: ``error`` (refuse, naming the row) | ``left`` | ``right``."""
    filter_overlong_prompts: bool = True
    """Drop prompts longer than ``max_prompt_length`` when loading (the count is reported); when true,
    ``truncation`` never sees an over-long prompt."""
    shuffle: bool = True
    """Shuffle training prompts each epoch (seeded, resumable)."""
    seed: int = 1
    """Seed of the data order."""
    apply_chat_template: bool = True
    """Format chat-message prompts with the tokenizer's chat template."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Prioritized replay of earlier prompts mixed into each step's batch (continual training)."""


@dataclass
class TrainerConfig(FreezableConfig):
    project_name: str = "hybridrl"
    """Project name (tracking backends, run directory)."""
    experiment_name: str = "default"
    """Experiment name (tracking backends, run directory)."""
    default_local_dir: str = "runs/${trainer.project_name}/${trainer.experiment_name}"
    """Run directory: resolved config, metrics, checkpoints, plots."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu) | ``cuda`` | ``cpu``."""
    nnodes: int = 1
    """Nodes in the job."""
    n_gpus_per_node: int = 1
    """Devices per node (CPU slots when ``device=cpu``); world size = nnodes × n_gpus_per_node."""
    total_epochs: int = 1
    """Passes over the training prompts."""
    total_training_steps: Optional[int] = None
    """Stop after this many steps; ``null`` = epochs × steps per epoch."""
    seed: int = 1
    """Global seed (model init, sampling, shuffling): a fixed seed gives the same run twice on CPU."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Trackers: any of ``console``, ``jsonl``, ``tensorboard``, ``wandb``, ``mlflow``."""
    save_freq: int = -1
    """Checkpoint every N steps (-1: only at the end when ``save_at_end``)."""
    save_at_end: bool = True
    """Write a checkpoint after the last step."""
    max_ckpt_to_keep: Optional[int] = None
    """Keep only the newest K checkpoints; ``null`` keeps all."""
    resume_mode: str = "auto"
    """``auto`` (latest checkpoint in the run directory, if any) | ``disable`` | ``resume_path`` (use ``resume_from_path``)."""
    resume_from_path: Optional[str] = None
    """Checkpoint directory to resume from when ``resume_mode=resume_path``."""
    test_freq: int = -1
    """Validate every N steps (-1 disables periodic validation)."""
    val_before_train: bool = True
    """Validate once before the first step."""
    balance_batch: bool = True
    """Reorder sequences so every DP rank gets a similar token count."""
    critic_warmup: int = 0
    """Steps that update only the critic before the actor starts learning."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray start-up and worker-group settings."""
    export_at_end: bool = False
    """After the last step, write the policy as a Hugging Face directory ``<run dir>/hf`` (safetensors + tokenizer)
    that transformers and vLLM load. ``hybridrl export <run dir> <out dir>`` does the same from any checkpoint."""
    max_restarts: int = 0
    """When a worker process dies or hangs (crash, OOM kill, lost node), stop all worker groups, start them again and
    resume from the run's last checkpoint, at most this many times in a run (0: fail at once, naming role and rank).
    An exception raised by worker code is not retried: it would happen again."""
    max_consecutive_nonfinite_steps: int = 5
    """Stop the run with a diagnosis after this many steps in a row whose gradients were not finite (each such
    optimizer step is skipped, weights unchanged). 0 never stops."""
    fault_injection: FaultInjectionConfig = field(default_factory=FaultInjectionConfig)
    """FOR TESTS ONLY: make a worker or the controller fail at a chosen step (see ``hybridrl.config.faults``)."""
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)
    """Prometheus endpoint and cost estimate."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Training-health alarms (KL band, reward collapse, entropy collapse)."""
    plugins: list[str] = field(default_factory=list)
    """Python files (``.py`` paths) or importable module names run before the config is validated, in the
    controller and in every worker: they add components to the registries (``@ADVANTAGE_ESTIMATORS.register(...)``,
    ``@POLICY_LOSSES.register(...)``, ``@ROLLOUT_ENGINES.register(...)``), whose names the config then accepts.
    Example: ``recipes/plugin_example.py``."""


@dataclass
class TrainConfig(FreezableConfig):
    """The PPO/GRPO trainer's whole configuration (``conf/ppo_trainer.yaml``)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model and how it is built."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy optimisation."""
    ref: ReferenceConfig = field(default_factory=ReferenceConfig)
    """Reference policy (for KL)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (PPO with GAE)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Model-based reward."""
    reward_judge: RewardJudgeConfig = field(default_factory=RewardJudgeConfig)
    """An LLM judge's score as a reward (a served model reads each response)."""
    reward_fusion: RewardFusionConfig = field(default_factory=RewardFusionConfig)
    """Weighted reward components, normalisation and reward-hacking guards."""
    custom_reward_function: CustomRewardConfig = field(default_factory=CustomRewardConfig)
    """Rule-based reward function override."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimation and KL-in-reward."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and lengths."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run-level settings: devices, steps, logging, checkpoints, Ray."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Generation overlapped with training (one-step-off, bounded staleness) on the standalone rollout pool."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form settings for recipes and plug-ins (never read by the core trainer)."""

"""Validation of a whole ``TrainConfig`` before any worker starts: one ``ConfigError`` listing every problem by key.

Types and unknown keys are caught earlier, when YAML and overrides are merged into the schema (``loader.py``);
this module checks values, choices, cross-field rules and files.
"""

from __future__ import annotations

import os
from pathlib import Path

from hybridrl.config.auto_dtype import resolve_dtype
from hybridrl.config.async_checks import check_async_training, check_off_policy_correction
from hybridrl.config.components import COMPONENT_REGISTRIES, registered_names, value_at
from hybridrl.config.checks import _choice, _fsdp_size, _positive, _require, critic_enabled
from hybridrl.config.distillation_checks import check_distillation, check_teacher_files
from hybridrl.config.errors import PREFORMATTED, ConfigError
from hybridrl.config.judge_checks import check_judge, check_judge_files
from hybridrl.config.multi_turn_checks import (check_agent_function, check_multi_turn, check_tool_config,
                                               resolved_file_name)
from hybridrl.config.plugins import load_plugins, resolved_plugins
from hybridrl.config.precision import OPTIMIZER_STATE_PRECISIONS
from hybridrl.config.pool_checks import check_rollout_pool, check_weight_transfer
from hybridrl.config.router_replay_checks import check_router_replay
from hybridrl.config.schema import LR_SCALINGS, TrainConfig
from hybridrl.config.sequence_parallel_checks import check_sequence_parallel
from hybridrl.config.sizes import AUTO_MICRO_BATCH, role_plan, trained_rows_per_prompt, world_size
from hybridrl.config.validation_machine import (DATA_FILE_SUFFIXES, _check_cpu_limits, _check_paths,
                                                _check_this_machine, resolved_device)

__all__ = ["DATA_FILE_SUFFIXES", "critic_enabled", "resolved_device", "validate_config"]

# Choices owned by the config layer. Names owned by a registry (estimators, losses, …) are read from that registry.
MODEL_DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flex_attention", "flash_attention_2")
TRUNCATION_MODES = ("error", "left", "right")
DEVICES = ("auto", "cuda", "cpu")
RESUME_MODES = ("auto", "disable", "resume_path")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow", "prometheus")
LR_SCHEDULERS = ("constant", "cosine")
REDUCE_DTYPES = ("float32", "bfloat16")
FUSION_WEIGHTINGS = ("fixed", "inverse_std")
GRAD_SYNC_MODES = ("step", "micro_batch")
LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
# Estimators whose baseline comes from the other responses to the same prompt.
GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_plus_plus_baseline")


def resolve_auto_dtype(config) -> None:
    """``model.dtype: auto`` made concrete for this machine (``config/auto_dtype.py``), before the config is frozen
    and before anything reads it; an explicit bf16 on a CPU that emulates it is warned about."""
    if not config.is_frozen and config.model.dtype in ("auto", "bfloat16"):
        config.model.dtype = resolve_dtype(config.model.dtype, resolved_device(config))


def validate_config(config: TrainConfig, *, check_paths: bool = True) -> None:
    """Raise ``ConfigError`` naming every invalid key; return ``None`` when the config can run.

    ``check_paths=False`` skips what depends on this machine — files, installed backends, visible devices — e.g. to
    compose a recipe meant for a GPU cluster.
    """
    error = ConfigError()
    resolve_auto_dtype(config)
    if not config.is_frozen:  # workers may start in another directory: give them absolute paths
        config.trainer.plugins = resolved_plugins(config.trainer.plugins)
        if config.rollout.multi_turn.tool_config_path:
            config.rollout.multi_turn.tool_config_path = str(Path(config.rollout.multi_turn.tool_config_path).resolve())
        if config.rollout.multi_turn.agent:
            config.rollout.multi_turn.agent = resolved_file_name(config.rollout.multi_turn.agent)
        if config.rollout.multi_turn.agent_python:  # not resolved: a venv's bin/python is a link out of the venv
            config.rollout.multi_turn.agent_python = os.path.abspath(config.rollout.multi_turn.agent_python)
    try:  # first: the components they register are valid choices below
        load_plugins(config.trainer.plugins)
    except ConfigError as plugin_error:
        error.extend(plugin_error)
    for check in (_check_sizes, _check_ranges, _check_choices, _check_algorithm_rules, _check_layout,
                  _check_micro_batch_sizing):
        check(config, error)
    if check_paths:
        _check_paths(config, error)
        check_tool_config(config, error)
        check_agent_function(config, error)
        check_teacher_files(config, error)
        check_judge_files(config, error)
        _check_this_machine(config, error)
    if not error:  # the batch identity is only meaningful once the individual sizes are sane
        _check_batch_plans(config, error)
    error.raise_if_any()


def _check_sizes(config: TrainConfig, error: ConfigError) -> None:
    data, actor, critic, rollout, trainer = config.data, config.actor, config.critic, config.rollout, config.trainer
    _positive(error, [
        ("data.train_batch_size", data.train_batch_size), ("data.val_batch_size", data.val_batch_size),
        ("data.max_prompt_length", data.max_prompt_length), ("data.max_response_length", data.max_response_length),
        ("actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
        ("actor.log_prob_micro_batch_size_per_gpu", actor.log_prob_micro_batch_size_per_gpu),
        ("actor.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu), ("actor.ppo_epochs", actor.ppo_epochs),
        ("ref.log_prob_micro_batch_size_per_gpu", config.ref.log_prob_micro_batch_size_per_gpu),
        ("critic.ppo_mini_batch_size", critic.ppo_mini_batch_size),
        ("critic.ppo_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu), ("critic.ppo_epochs", critic.ppo_epochs),
        ("rollout.n", rollout.n), ("rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size),
        ("rollout.max_num_seqs", rollout.max_num_seqs), ("rollout.max_num_batched_tokens", rollout.max_num_batched_tokens),
        ("rollout.kv_cache_memory_mb", rollout.kv_cache_memory_mb), ("rollout.block_size", rollout.block_size),
        ("rollout.weight_sync_bucket_mb", rollout.weight_sync_bucket_mb), ("rollout.val_kwargs.n", rollout.val_kwargs.n),
        ("reward_model.micro_batch_size_per_gpu", config.reward_model.micro_batch_size_per_gpu),
        ("trainer.nnodes", trainer.nnodes), ("trainer.n_gpus_per_node", trainer.n_gpus_per_node),
        ("trainer.total_epochs", trainer.total_epochs), ("trainer.total_training_steps", trainer.total_training_steps),
        ("trainer.max_ckpt_to_keep", trainer.max_ckpt_to_keep),
        ("custom_reward_function.timeout_s", config.custom_reward_function.timeout_s),
    ])
    for role in ("actor", "critic"):
        value = getattr(config, role).ppo_micro_batch_size_per_gpu
        _require(error, f"{role}.ppo_micro_batch_size_per_gpu", value,
                 value is None or value == AUTO_MICRO_BATCH or (isinstance(value, int) and value > 0),
                 f"must be a positive number of sequences or '{AUTO_MICRO_BATCH}' (sized from memory at start-up)")
    for key, value in (("trainer.save_freq", trainer.save_freq), ("trainer.test_freq", trainer.test_freq)):
        _require(error, key, value, value == -1 or value > 0, "must be -1 (off) or a positive number of steps")
    _require(error, "trainer.critic_warmup", trainer.critic_warmup, trainer.critic_warmup >= 0, "must be >= 0")
    for key in ("max_restarts", "max_consecutive_nonfinite_steps"):
        _require(error, f"trainer.{key}", getattr(trainer, key), getattr(trainer, key) >= 0, "must be >= 0")


def _check_ranges(config: TrainConfig, error: ConfigError) -> None:
    actor, rollout, algorithm = config.actor, config.rollout, config.algorithm
    for role in ("actor", "critic"):
        role_config = getattr(config, role)
        _positive(error, [(f"{role}.optim.lr", role_config.optim.lr), (f"{role}.grad_clip", role_config.grad_clip)])
        optim = role_config.optim
        _require(error, f"{role}.optim.weight_decay", optim.weight_decay, optim.weight_decay >= 0, "must be >= 0")
        _require(error, f"{role}.optim.betas", list(optim.betas), len(optim.betas) == 2 and all(0 <= b < 1 for b in optim.betas),
                 "must be two numbers in [0, 1)")
        _require(error, f"{role}.optim.lr_warmup_steps_ratio", optim.lr_warmup_steps_ratio,
                 0 <= optim.lr_warmup_steps_ratio < 1, "must be in [0, 1)")
        _require(error, f"{role}.optim.min_lr_ratio", optim.min_lr_ratio, 0 <= optim.min_lr_ratio <= 1, "must be in [0, 1]")
    for key, value in (("actor.clip_ratio_low", actor.clip_ratio_low), ("actor.clip_ratio_high", actor.clip_ratio_high),
                       ("actor.entropy_coeff", actor.entropy_coeff), ("actor.kl_loss_coef", actor.kl_loss_coef),
                       ("critic.cliprange_value", config.critic.cliprange_value),
                       ("algorithm.kl_ctrl.kl_coef", algorithm.kl_ctrl.kl_coef)):
        _require(error, key, value, value >= 0, "must be >= 0")
    _require(error, "actor.clip_ratio_low", actor.clip_ratio_low, actor.clip_ratio_low < 1, "must be < 1 (ratio ≥ 1 − low)")
    _require(error, "actor.clip_ratio_c", actor.clip_ratio_c, actor.clip_ratio_c > 1, "dual-clip bound must be > 1")
    for key, value in (("algorithm.gamma", algorithm.gamma), ("algorithm.lam", algorithm.lam)):
        _require(error, key, value, 0 <= value <= 1, "must be in [0, 1]")
    for prefix, sampling in (("rollout", rollout), ("rollout.val_kwargs", rollout.val_kwargs)):
        _require(error, f"{prefix}.temperature", sampling.temperature, sampling.temperature > 0, "must be > 0")
        _require(error, f"{prefix}.top_p", sampling.top_p, 0 < sampling.top_p <= 1, "must be in (0, 1]")
        _require(error, f"{prefix}.top_k", sampling.top_k, sampling.top_k == -1 or sampling.top_k > 0,
                 "must be -1 (off) or positive")
    _require(error, "rollout.gpu_memory_utilization", rollout.gpu_memory_utilization,
             0 < rollout.gpu_memory_utilization <= 1, "must be in (0, 1]")
    _positive(error, [("algorithm.kl_ctrl.target_kl", algorithm.kl_ctrl.target_kl),
                      ("algorithm.kl_ctrl.horizon", algorithm.kl_ctrl.horizon)])
    _check_lora(config, error)
    _check_anti_forgetting(config, error)


def _check_lora(config: TrainConfig, error: ConfigError) -> None:
    lora = config.model.lora
    _require(error, "model.lora.rank", lora.rank, lora.rank >= 0, "must be >= 0 (0 = no LoRA)")
    if lora.rank > 0:
        _require(error, "model.lora.alpha", lora.alpha, lora.alpha > 0, "must be > 0")
        _require(error, "model.lora.dropout", lora.dropout, 0 <= lora.dropout < 1, "must be in [0, 1)")
        _require(error, "model.lora.target_modules", list(lora.target_modules), len(lora.target_modules) > 0,
                 "must name at least one module (e.g. q_proj), or be [all-linear]")


def _check_anti_forgetting(config: TrainConfig, error: ConfigError) -> None:
    """``actor.ptx``, ``actor.ewc``, ``data.replay``: ranges, and the sizes that must split evenly over ranks."""
    ptx, ewc, replay, data = config.actor.ptx, config.actor.ewc, config.data.replay, config.data
    world, mini = world_size(config), config.actor.ppo_mini_batch_size
    for key, value in (("actor.ptx.coef", ptx.coef), ("actor.ewc.coef", ewc.coef),
                       ("data.replay.alpha", replay.alpha)):
        _require(error, key, value, value >= 0, "must be >= 0")
    _positive(error, [("actor.ewc.fisher_batches", ewc.fisher_batches), ("data.replay.capacity", replay.capacity)])
    if ptx.coef > 0:
        steps_per_epoch = data.train_batch_size // mini if mini > 0 else 1
        _require(error, "actor.ptx.batch_size", ptx.batch_size,
                 ptx.batch_size > 0 and ptx.batch_size % (world * steps_per_epoch) == 0,
                 f"must be a positive multiple of devices ({world}) × optimizer steps per epoch ({steps_per_epoch}): "
                 "every rank gets one equal SFT chunk per optimizer step")
        _require(error, "actor.ptx.train_files", [], bool(ptx.train_files) or data.synthetic_task is not None,
                 "give SFT files, or set data.synthetic_task to use its SFT view, when actor.ptx.coef > 0")
        _require(error, "actor.ptx.coef", ptx.coef, not config.actor.adaptive_accumulation.enable,
                 "PPO-ptx cuts its SFT rows per optimizer step: it cannot follow actor.adaptive_accumulation's "
                 "changing mini-batches; turn one of them off")
    rows_per_rank = data.train_batch_size * trained_rows_per_prompt(config) // max(world, 1)
    if ewc.coef > 0 and ewc.fisher_batches > 0:
        _require(error, "actor.ewc.fisher_batches", ewc.fisher_batches, rows_per_rank % ewc.fisher_batches == 0,
                 f"must divide the {rows_per_rank} rollout rows per rank of a step (data.train_batch_size × "
                 "rollout.n × an agent's rollout.multi_turn.agent_max_sequences ÷ devices)")
    if replay.enable:
        _require(error, "data.replay.fraction", replay.fraction,
                 0 < replay.fraction < 1 and round(replay.fraction * data.train_batch_size) >= 1,
                 f"must be in (0, 1) and replay at least one of data.train_batch_size={data.train_batch_size} prompts")


def _check_choices(config: TrainConfig, error: ConfigError) -> None:
    for key in COMPONENT_REGISTRIES:
        _choice(error, key, value_at(config, key), registered_names(key))
    _choice(error, "model.dtype", config.model.dtype, MODEL_DTYPES)
    _choice(error, "model.attn_implementation", config.model.attn_implementation, ATTENTION_IMPLEMENTATIONS)
    _choice(error, "data.truncation", config.data.truncation, TRUNCATION_MODES)
    _choice(error, "trainer.device", config.trainer.device, DEVICES)
    _choice(error, "trainer.resume_mode", config.trainer.resume_mode, RESUME_MODES)
    _choice(error, "actor.old_log_prob", config.actor.old_log_prob, ("auto", "recompute"))
    for logger in config.trainer.logger:
        _choice(error, "trainer.logger", logger, LOGGERS)
    for role in ("actor", "critic"):
        role_config = getattr(config, role)
        _choice(error, f"{role}.optim.lr_scheduler", role_config.optim.lr_scheduler, LR_SCHEDULERS)
        _choice(error, f"{role}.fsdp.reduce_dtype", role_config.fsdp.reduce_dtype, REDUCE_DTYPES)
        _choice(error, f"{role}.fsdp.grad_sync", role_config.fsdp.grad_sync, GRAD_SYNC_MODES)
        _fsdp_size(error, f"{role}.fsdp.fsdp_size", role_config.fsdp.fsdp_size, world_size(config))
        gather_once = role_config.fsdp.gather_once
        _require(error, f"{role}.fsdp.gather_once", gather_once, isinstance(gather_once, bool) or gather_once == "auto",
                 "expected true, false or auto")
        _choice(error, f"{role}.strategy", getattr(role_config, "strategy", "fsdp2"), ("fsdp2",))
        _choice(error, f"{role}.optim.state_precision", role_config.optim.state_precision, OPTIMIZER_STATE_PRECISIONS)
    error.extend(config.trainer.monitoring.problems())
    for name in ("ray", "fault_injection", "health"):
        try:
            getattr(config.trainer, name).validate()
        except ValueError as nested_error:
            error.add(f"trainer.{name}", PREFORMATTED, str(nested_error))


def _check_algorithm_rules(config: TrainConfig, error: ConfigError) -> None:
    estimator, n = config.algorithm.adv_estimator, config.rollout.n
    if estimator in GROUP_ESTIMATORS and n < 2:
        error.add("rollout.n", n, f"algorithm.adv_estimator={estimator} compares responses to the same prompt: "
                                  "it needs rollout.n >= 2 (a group of one has no baseline)")
    if estimator == "gae" and config.critic.enable is False:
        error.add("critic.enable", False, "algorithm.adv_estimator=gae needs a critic (value model)")
    longest_sequence = config.data.max_prompt_length + config.data.max_response_length
    for role in ("actor", "critic"):
        role_config = getattr(config, role)
        sp = role_config.ulysses_sequence_parallel_size
        sp = sp if isinstance(sp, int) and sp >= 1 else 1  # a bad value is refused by the layout checks
        if role_config.use_dynamic_bsz and role_config.ppo_max_token_len_per_gpu * sp < longest_sequence:
            split = f" (× {role}.ulysses_sequence_parallel_size={sp}: a group's devices share it)" if sp > 1 else ""
            error.add(f"{role}.ppo_max_token_len_per_gpu", role_config.ppo_max_token_len_per_gpu,
                      f"must hold one whole sequence{split}: data.max_prompt_length + data.max_response_length = "
                      f"{longest_sequence}")
    if config.trainer.critic_warmup > 0 and not critic_enabled(config):
        error.add("trainer.critic_warmup", config.trainer.critic_warmup,
                  "warms up a critic, but this run has none: the actor would silently not train for those steps")
    if config.actor.policy_loss == "gspo" and max(config.actor.clip_ratio_low, config.actor.clip_ratio_high) >= 0.01:
        error.add("actor.clip_ratio_high", config.actor.clip_ratio_high,
                  "GSPO clips a sequence-level ratio: use clip ranges of order 1e-4 (the paper: 3e-4 / 4e-4)")
    for name in config.reward_fusion.normalize:
        _choice(error, "reward_fusion.normalize", name, ("rule", "rm", "judge"))
    _choice(error, "reward_fusion.weighting", config.reward_fusion.weighting, FUSION_WEIGHTINGS)
    for key in ("length_penalty_coef", "diversity_penalty_coef"):
        value = getattr(config.reward_fusion, key)
        _require(error, f"reward_fusion.{key}", value, value >= 0, "must be >= 0 (it is subtracted as a penalty)")
    if config.rollout.tensor_model_parallel_size > 1 and config.rollout.name == "hf":
        error.add("rollout.tensor_model_parallel_size", config.rollout.tensor_model_parallel_size,
                  "rollout.name=hf generates with the actor's own (FSDP-sharded) module, one replica per device; "
                  "tensor-parallel generation needs rollout.name=vllm")
    overlong = config.algorithm.overlong_buffer
    if overlong.enable and not 0 < overlong.len < config.data.max_response_length:
        error.add("algorithm.overlong_buffer.len", overlong.len,
                  f"must be in (0, data.max_response_length={config.data.max_response_length})")
    _check_dynamic_sampling(config, error)
    _check_prompt_source(config, error)
    if config.trainer.resume_mode == "resume_path" and not config.trainer.resume_from_path:
        error.add("trainer.resume_from_path", None, "is required when trainer.resume_mode=resume_path")
    if config.reward_model.enable and not config.reward_model.model_path:
        error.add("reward_model.model_path", None, "is required when reward_model.enable=true")
    _require(error, "reward_model.n_gpus", config.reward_model.n_gpus, config.reward_model.n_gpus >= 0,
             "must be >= 0 (0: colocated with the actor; N: its own pool of N devices)")


def _check_dynamic_sampling(config: TrainConfig, error: ConfigError) -> None:
    """DAPO's dynamic sampling: its group size, batches, metric and generation batch."""
    filtering, data = config.algorithm.filter_groups, config.data
    filters = registered_names("algorithm.filter_groups.metric")
    if filtering.metric not in filters and not filtering.metric.isidentifier():
        error.add("algorithm.filter_groups.metric", filtering.metric,
                  f"must be one of {', '.join(filters)}, or the name of a value the reward function returns beside "
                  "its score (verl's acc)")
    if filtering.metric == "seq_final_reward" and config.algorithm.use_kl_in_reward:
        error.add("algorithm.filter_groups.metric", "seq_final_reward",
                  "hybridrl filters groups before the KL-in-reward penalty: use seq_reward (or "
                  "algorithm.use_kl_in_reward=false, where the two are the same)")
    _positive(error, [("data.gen_batch_size", data.gen_batch_size)])
    if not filtering.enable:
        if data.gen_batch_size not in (None, data.train_batch_size):
            error.add("data.gen_batch_size", data.gen_batch_size, "sets the generation batch of dynamic sampling: "
                      "it needs algorithm.filter_groups.enable=true (or leave it null)")
        return
    if config.rollout.n < 2:
        error.add("algorithm.filter_groups.enable", True, "dynamic sampling compares a prompt's responses: "
                                                          "it needs rollout.n >= 2")
    if filtering.max_num_gen_batches < 1:
        error.add("algorithm.filter_groups.max_num_gen_batches", filtering.max_num_gen_batches, "must be >= 1")


def _check_prompt_source(config: TrainConfig, error: ConfigError) -> None:
    data = config.data
    if not data.train_files and data.synthetic_task is None:
        error.add("data.train_files", [], "give at least one parquet/JSONL file, or set data.synthetic_task")
    if data.synthetic_task is not None:
        for key in ("train_files", "val_files"):
            if getattr(data, key):
                error.add(f"data.{key}", getattr(data, key), f"and data.synthetic_task={data.synthetic_task!r} are "
                          "both set: choose one source of prompts (data.synthetic_task=null for files)")
    _choice(error, "rollout.load_format", config.rollout.load_format, LOAD_FORMATS)


def _check_layout(config: TrainConfig, error: ConfigError) -> None:
    tp, devices = config.rollout.tensor_model_parallel_size, world_size(config)
    if devices % tp and config.rollout.n_gpus == 0:  # a standalone pool's replicas divide its own devices
        error.add("rollout.tensor_model_parallel_size", tp,
                  f"must divide the {devices} devices (trainer.nnodes × trainer.n_gpus_per_node)")
    check_sequence_parallel(config, error)
    check_router_replay(config, error)
    check_weight_transfer(config, error)
    check_rollout_pool(config, error)
    check_multi_turn(config, error)
    check_distillation(config, error)
    check_judge(config, error)
    check_async_training(config, error)
    check_off_policy_correction(config, error)
    if config.trainer.device == "cpu":
        _check_cpu_limits(config, error)


def _check_micro_batch_sizing(config: TrainConfig, error: ConfigError) -> None:
    """``ppo_micro_batch_size_per_gpu: auto`` and ``actor.adaptive_accumulation``."""
    for role in ("actor", "critic"):
        role_config = getattr(config, role)
        sizing = role_config.micro_batch_sizing
        _positive(error, [(f"{role}.micro_batch_sizing.memory_budget_mb", sizing.memory_budget_mb)])
        _require(error, f"{role}.micro_batch_sizing.headroom", sizing.headroom, 0 <= sizing.headroom < 1,
                 "must be in [0, 1) (a fraction of the budget kept free; 0.10-0.20 is usual)")
        if role_config.ppo_micro_batch_size_per_gpu == AUTO_MICRO_BATCH and role_config.use_dynamic_bsz:
            error.add(f"{role}.ppo_micro_batch_size_per_gpu", AUTO_MICRO_BATCH,
                      f"sizes fixed micro-batches; with {role}.use_dynamic_bsz=true the token budget "
                      f"{role}.ppo_max_token_len_per_gpu cuts them: use one or the other")
    adaptive = config.actor.adaptive_accumulation
    if not adaptive.enable:
        return
    key = "actor.adaptive_accumulation"
    _require(error, f"{key}.min_steps", adaptive.min_steps, adaptive.min_steps >= 1, "must be >= 1")
    _require(error, f"{key}.max_steps", adaptive.max_steps, adaptive.max_steps >= adaptive.min_steps,
             f"must be >= {key}.min_steps={adaptive.min_steps}")
    _choice(error, f"{key}.lr_scaling", adaptive.lr_scaling, LR_SCALINGS)
    _require(error, f"{key}.tolerance", adaptive.tolerance, adaptive.tolerance >= 1, "must be >= 1 (a factor)")
    _require(error, f"{key}.min_updates", adaptive.min_updates, adaptive.min_updates >= 0, "must be >= 0")
    if config.actor.use_dynamic_bsz:
        error.add(f"{key}.enable", True, "needs fixed micro-batches: with actor.use_dynamic_bsz=true the "
                                         "partitioner chooses the micro-batch count")
    if world_size(config) == 1 and adaptive.min_steps < 2:
        error.add(f"{key}.min_steps", adaptive.min_steps, "must be >= 2 on a single rank: one micro-batch on one "
                                                          "rank gives one batch size, and the noise scale needs two")


def _check_batch_plans(config: TrainConfig, error: ConfigError) -> None:
    for role in ["actor"] + (["critic"] if critic_enabled(config) else []):
        try:
            plan = role_plan(config, role)
        except ConfigError as plan_error:
            error.extend(plan_error)
            continue
        if role == "actor" and config.actor.adaptive_accumulation.enable and plan.grad_accum_steps is not None:
            _check_adaptive_bounds(config, plan.grad_accum_steps, error)


def _check_adaptive_bounds(config: TrainConfig, steps: int, error: ConfigError) -> None:
    """The configured accumulation steps (where the learning rate was tuned) must lie within the adaptive bounds;
    an ``auto`` micro-batch is checked when the worker has sized it."""
    adaptive = config.actor.adaptive_accumulation
    for name, bound, outside in (("min_steps", adaptive.min_steps, steps < adaptive.min_steps),
                                 ("max_steps", adaptive.max_steps, steps > adaptive.max_steps)):
        if outside:
            error.add(f"actor.adaptive_accumulation.{name}", bound,
                      f"must bound the configured {steps} accumulation steps (the learning rate is tuned there)")

"""Validation of the configs of the trainers that generate nothing — SFT, reward model, DPO and its family: one
``ConfigError`` listing every problem by key, as :func:`hybridrl.config.validation.validate_config` does for RL."""

from __future__ import annotations

from hybridrl.config.checks import _choice, _fsdp_size, _positive, _require
from hybridrl.config.dpo_schema import PREFERENCE_LOSSES, REFERENCE_FREE_LOSSES, REFERENCE_MODES, DPOConfig
from hybridrl.config.errors import ConfigError
from hybridrl.config.multi_turn_checks import BUILTIN_TOOL_NAMES
from hybridrl.config.rm_schema import SYNTHETIC_PREFERENCES, RMConfig
from hybridrl.config.sft_schema import SFTConfig
from hybridrl.config.validation import (ATTENTION_IMPLEMENTATIONS, DEVICES, GRAD_SYNC_MODES, LOGGERS,
                                        LR_SCHEDULERS, MODEL_DTYPES, REDUCE_DTYPES, resolve_auto_dtype)
from hybridrl.config.validation_machine import _check_data_file, _check_model_dir

__all__ = ["validate_dpo_config", "validate_rm_config", "validate_sft_config"]


def validate_sft_config(config: SFTConfig, *, check_paths: bool = True) -> None:
    """Raise ``ConfigError`` naming every invalid key of an SFT config."""
    error = ConfigError()
    resolve_auto_dtype(config)
    data, trainer = config.data, config.trainer
    _positive(error, [
        ("data.train_batch_size", data.train_batch_size), ("data.micro_batch_size_per_gpu", data.micro_batch_size_per_gpu),
        ("data.max_prompt_length", data.max_prompt_length), ("data.max_response_length", data.max_response_length),
        ("trainer.total_training_steps", trainer.total_training_steps), ("trainer.nnodes", trainer.nnodes),
        ("trainer.n_gpus_per_node", trainer.n_gpus_per_node), ("optim.lr", config.optim.lr),
    ])
    _choice(error, "model.dtype", config.model.dtype, MODEL_DTYPES)
    _choice(error, "trainer.device", trainer.device, DEVICES)
    _choice(error, "fsdp.reduce_dtype", config.fsdp.reduce_dtype, REDUCE_DTYPES)
    _choice(error, "fsdp.grad_sync", config.fsdp.grad_sync, GRAD_SYNC_MODES)
    _fsdp_size(error, "fsdp.fsdp_size", config.fsdp.fsdp_size, config.trainer.nnodes * config.trainer.n_gpus_per_node)
    for logger in trainer.logger:
        _choice(error, "trainer.logger", logger, LOGGERS)
    for name in data.tools:  # the schemas the chat template renders come from the built-in tools
        _choice(error, "data.tools", name, BUILTIN_TOOL_NAMES)
    if not data.train_files and data.synthetic_task is None:
        error.add("data.train_files", [], "give at least one parquet/JSONL file, or set data.synthetic_task")
    _check_whole_micro_batches(error, data, trainer)
    if check_paths:
        _check_model_dir(error, "model.path", config.model.path)
        for path in data.train_files:
            _check_data_file(error, "data.train_files", path)
    error.raise_if_any()


def validate_rm_config(config: RMConfig, *, check_paths: bool = True) -> None:
    """Raise ``ConfigError`` naming every invalid key of a reward-model training config."""
    error = ConfigError()
    _check_pair_job(config, error, check_paths)
    _require(error, "loss.center_coef", config.loss.center_coef, config.loss.center_coef >= 0, "must be >= 0")
    error.raise_if_any()


def validate_dpo_config(config: DPOConfig, *, check_paths: bool = True) -> None:
    """Raise ``ConfigError`` naming every invalid key of a preference-optimisation (DPO) config."""
    error = ConfigError()
    _check_pair_job(config, error, check_paths)
    loss = config.loss
    _choice(error, "loss.type", loss.type, PREFERENCE_LOSSES)
    _choice(error, "loss.reference_log_probs", loss.reference_log_probs, REFERENCE_MODES)
    _require(error, "loss.beta", loss.beta, loss.beta > 0, "must be > 0 (β: the implicit reward's scale)")
    _require(error, "loss.label_smoothing", loss.label_smoothing, 0 <= loss.label_smoothing < 0.5,
             "must be in [0, 0.5) (cDPO: the share of labels taken to be flipped)")
    if loss.label_smoothing and loss.type != "dpo":
        error.add("loss.label_smoothing", loss.label_smoothing, f"is read only by loss.type=dpo, not {loss.type}: "
                                                                "drop it")
    _require(error, "loss.simpo_gamma", loss.simpo_gamma, loss.simpo_gamma >= 0, "must be >= 0 (a target margin)")
    if loss.reference_log_probs == "on_the_fly" and loss.type in REFERENCE_FREE_LOSSES:
        error.add("loss.reference_log_probs", loss.reference_log_probs,
                  f"loss.type={loss.type} uses no reference policy, so there are no reference log-probs to compute: "
                  "drop it")
    for key in ("desirable_weight", "undesirable_weight"):
        value = getattr(loss, key)
        _require(error, f"loss.{key}", value, value > 0, "must be > 0 (KTO's weight of one label's rows)")
        if value != 1.0 and loss.type != "kto":
            error.add(f"loss.{key}", value, f"is read only by loss.type=kto, not {loss.type}: drop it")
    error.raise_if_any()


def _check_pair_job(config: RMConfig | DPOConfig, error: ConfigError, check_paths: bool) -> None:
    """The keys a trainer on preference pairs shares (``data``, ``model``, ``optim``, ``fsdp``, ``trainer``)."""
    resolve_auto_dtype(config)
    data, trainer, loss = config.data, config.trainer, config.loss
    _positive(error, [
        ("data.train_batch_size", data.train_batch_size), ("data.micro_batch_size_per_gpu", data.micro_batch_size_per_gpu),
        ("data.val_batch_size", data.val_batch_size), ("data.synthetic_spread", data.synthetic_spread),
        ("data.max_prompt_length", data.max_prompt_length), ("data.max_response_length", data.max_response_length),
        ("trainer.total_training_steps", trainer.total_training_steps), ("trainer.nnodes", trainer.nnodes),
        ("trainer.n_gpus_per_node", trainer.n_gpus_per_node), ("trainer.max_ckpt_to_keep", trainer.max_ckpt_to_keep),
        ("optim.lr", config.optim.lr), ("loss.grad_clip", loss.grad_clip),
    ])
    _require(error, "data.val_fraction", data.val_fraction, 0 <= data.val_fraction < 1, "must be in [0, 1)")
    for key, value in (("trainer.save_freq", trainer.save_freq), ("trainer.test_freq", trainer.test_freq)):
        _require(error, key, value, value == -1 or value > 0, "must be -1 (off) or a positive number of steps")
    _choice(error, "data.synthetic_preference", data.synthetic_preference, SYNTHETIC_PREFERENCES)
    _choice(error, "model.dtype", config.model.dtype, MODEL_DTYPES)
    _choice(error, "model.attn_implementation", config.model.attn_implementation, ATTENTION_IMPLEMENTATIONS)
    _choice(error, "optim.lr_scheduler", config.optim.lr_scheduler, LR_SCHEDULERS)
    _choice(error, "fsdp.reduce_dtype", config.fsdp.reduce_dtype, REDUCE_DTYPES)
    _choice(error, "fsdp.grad_sync", config.fsdp.grad_sync, GRAD_SYNC_MODES)
    _fsdp_size(error, "fsdp.fsdp_size", config.fsdp.fsdp_size, config.trainer.nnodes * config.trainer.n_gpus_per_node)
    _choice(error, "trainer.device", trainer.device, DEVICES)
    _choice(error, "trainer.resume_mode", trainer.resume_mode, ("auto", "disable"))
    for logger in trainer.logger:
        _choice(error, "trainer.logger", logger, LOGGERS)
    if config.fsdp.optimizer_offload:
        error.add("fsdp.optimizer_offload", True, "applies to the RL actor and critic, whose optimizers sit idle while "
                  "other roles run; this trainer steps its optimizer every step — fsdp.param_offload=true keeps "
                  "parameters, gradients and the optimizer step on the host")
    if not data.train_files and data.synthetic_task is None:
        error.add("data.train_files", [], "give at least one parquet/JSONL file of preference pairs, or set "
                                          "data.synthetic_task")
    _check_whole_micro_batches(error, data, trainer)
    if trainer.device == "cpu" and config.model.dtype == "float16":
        error.add("model.dtype", "float16", "float16 training is not supported on CPU; use bfloat16 or float32")
    if check_paths:
        _check_model_dir(error, "model.path", config.model.path)
        for key in ("train_files", "val_files"):
            for path in getattr(data, key):
                _check_data_file(error, f"data.{key}", path)


def _check_whole_micro_batches(error: ConfigError, data, trainer) -> None:
    """``data.train_batch_size`` must split into whole micro-batches on every device (checked once the sizes are
    valid: a zero would divide)."""
    devices = trainer.nnodes * trainer.n_gpus_per_node
    if not error and data.train_batch_size % (devices * data.micro_batch_size_per_gpu):
        error.add("data.train_batch_size", data.train_batch_size,
                  f"must be a multiple of devices ({devices}) × data.micro_batch_size_per_gpu "
                  f"({data.micro_batch_size_per_gpu}): global = micro × accumulation × world must hold exactly")

"""verl's config keys, and what each one is in hybridrl: the one table behind ``verl_layout`` (which the loader uses
to translate overrides) and behind the generated table in ``docs/verl.md`` and the README.

verl (``python3 -m verl.trainer.main_ppo``) nests the policy's settings under ``actor_rollout_ref.{actor, rollout,
ref, model}``; hybridrl keeps them at the top (``actor``, ``rollout``, ``ref``, ``model``). Keys that are spelt the
same in both (``data.train_batch_size``, ``algorithm.adv_estimator``, ``trainer.total_epochs``, ``critic.optim.lr``,
…) are not listed: they need no translation. Every other verl key is one of

- :class:`Moved`: the same concept under another name (a key, or a whole prefix ending in ``.``);
- :class:`NoEffect`: accepted, reported, and without effect, because hybridrl always behaves the way the accepted
  values say (``ulysses_sequence_parallel_size=1``) or the key only tunes verl's own machinery
  (``trainer.use_legacy_worker_impl``). Other values are refused with the reason;
- :class:`Unsupported`: a concept hybridrl lacks; refused with what to do instead.

A verl key that matches nothing here and is not spelt like one of ours is an unknown key, with a suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

ARR = "actor_rollout_ref."


@dataclass(frozen=True)
class Moved:
    """verl's ``verl`` is hybridrl's ``ours`` (several keys when one verl key sets several of ours). A prefix rule
    (``verl`` ends in ``.``) moves every key below it. ``values`` translates verl's spelling of a value."""

    verl: str
    ours: Union[str, tuple[str, ...]]
    values: Mapping[str, str] = field(default_factory=dict)

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.ours,) if isinstance(self.ours, str) else self.ours


@dataclass(frozen=True)
class NoEffect:
    """Accepted without effect (reported by ``hybridrl config`` and the trainer's log). ``values``: the only values
    accepted (lower-case, ``null`` for none) because only they describe what hybridrl does; ``None`` = any value."""

    verl: str
    reason: str
    values: Optional[tuple[str, ...]] = None


@dataclass(frozen=True)
class Unsupported:
    """A verl concept hybridrl does not have: refused with ``reason`` (what to do instead). ``values`` lists the
    harmless values (verl's defaults, which mean "off") that are accepted without effect."""

    verl: str
    reason: str
    values: tuple[str, ...] = ()


Rule = Union[Moved, NoEffect, Unsupported]

_SP = ("the reward model scores whole sequences on each rank (sequence parallelism is for the actor, reference and "
       "critic): keep it at 1, and lower reward_model.micro_batch_size_per_gpu if its passes do not fit")
_PROFILER = "hybridrl logs a per-phase step-time breakdown (timing/*) and prints it at the end; no verl profiler"
_CHECKPOINT = "hybridrl checkpoints model, optimizer and trainer state together, always"
_FUSED_OPTIONS = ("hybridrl's fused head is one implementation (chunked torch matmuls, forward and backward), so "
                  "verl's backend choices do not apply")
_IMAGES_ONLY = "hybridrl reads images (data.image_key), not video"

RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------------------------------- actor_rollout_ref.model
    Moved(ARR + "model.lora_rank", "model.lora.rank"),
    Moved(ARR + "model.lora_alpha", "model.lora.alpha"),
    Moved(ARR + "model.target_modules", "model.lora.target_modules"),
    Moved(ARR + "model.external_lib", "trainer.plugins"),
    NoEffect(ARR + "model.fused_kernel_options.", _FUSED_OPTIONS),
    NoEffect(ARR + "model.use_shm", "start-up speed only: hybridrl reads the model directory where it is"),
    NoEffect(ARR + "model.use_liger", "hybridrl has no Liger kernels; the plain HF modules run", ("false",)),
    NoEffect(ARR + "model.enable_activation_offload", "activation offload is not implemented; use "
             "model.enable_gradient_checkpointing", ("false",)),
    Unsupported(ARR + "model.custom_chat_template", "put the chat template in the tokenizer directory "
                "(tokenizer_config.json), which hybridrl reads", ("null",)),
    Unsupported(ARR + "model.override_config", "edit config.json of a copy of the model directory", ("{}",)),
    Unsupported(ARR + "model.lora_adapter_path", "merge the adapter into a copy of the model first", ("null",)),
    Unsupported(ARR + "model.exclude_modules", "list the layers that get adapters in model.lora.target_modules",
                ("null",)),
    Unsupported(ARR + "model.hf_config_path", "config.json is read from model.path", ("null",)),
    Unsupported(ARR + "model.tiled_mlp.", "tiled MLPs are not implemented", ("false",)),
    Unsupported(ARR + "model.mtp.", "multi-token prediction is not implemented", ("false",)),
    # ---------------------------------------------------------------------------------------- actor_rollout_ref.actor
    Moved(ARR + "actor.clip_ratio", ("actor.clip_ratio_low", "actor.clip_ratio_high")),
    Moved(ARR + "actor.policy_loss.loss_mode", "actor.policy_loss"),
    Moved(ARR + "actor.strategy", "actor.strategy", {"fsdp": "fsdp2", "fsdp2": "fsdp2"}),
    Moved(ARR + "actor.optim.clip_grad", "actor.grad_clip"),
    Moved(ARR + "actor.optim.lr_scheduler_type", "actor.optim.lr_scheduler"),
    Moved(ARR + "actor.optim.warmup_style", "actor.optim.lr_scheduler"),
    Moved(ARR + "actor.use_remove_padding", "model.use_remove_padding"),
    Moved(ARR + "actor.use_prefix_grouper", "model.share_prompts"),
    Moved(ARR + "actor.rollout_n", "rollout.n"),
    Moved(ARR + "actor.fsdp_config.dtype", "model.dtype", {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}),
    NoEffect(ARR + "actor.fsdp_config.model_dtype", "master weights are always float32", ("fp32", "float32")),
    Moved(ARR + "actor.fsdp_config.fsdp_size", "actor.fsdp.fsdp_size"),
    NoEffect(ARR + "actor.fsdp_config.wrap_policy.", "FSDP2 shards every decoder layer, always"),
    NoEffect(ARR + "actor.fsdp_config.offload_policy", "parameter offload is actor.fsdp.param_offload", ("false",)),
    NoEffect(ARR + "actor.fsdp_config.forward_prefetch", "FSDP2 prefetches the next layer's all-gather, always"),
    NoEffect(ARR + "actor.fsdp_config.use_orig_params", "FSDP2 always keeps the original parameters"),
    NoEffect(ARR + "actor.fsdp_config.seed", "model initialisation is seeded by trainer.seed"),
    NoEffect(ARR + "actor.fsdp_config.full_determinism", "a fixed trainer.seed gives the same run twice on CPU; on GPU "
             "hybridrl does not force deterministic kernels", ("false",)),
    NoEffect(ARR + "actor.fsdp_config.strategy", "FSDP2 is the only backend", ("fsdp", "fsdp2")),
    NoEffect(ARR + "actor.fsdp_config.forward_only", "set by verl itself per role"),
    NoEffect(ARR + "actor.fsdp_config.use_torch_compile", "verl compiles its entropy function; hybridrl's compile "
             "switch is model.use_torch_compile (decoder layers)"),
    NoEffect(ARR + "actor.fsdp_config.entropy_from_logits_with_chunking", "memory only: entropy is computed from the "
             "whole logits"),
    NoEffect(ARR + "actor.fsdp_config.entropy_checkpointing", "memory only: entropy is not recomputed in backward"),
    Moved(ARR + "actor.fsdp_config.ulysses_sequence_parallel_size", "actor.ulysses_sequence_parallel_size"),
    Moved(ARR + "actor.ulysses_sequence_parallel_size", "actor.ulysses_sequence_parallel_size"),
    Moved(ARR + "actor.use_fused_kernels", "model.use_fused_kernels"),
    NoEffect(ARR + "actor.use_torch_compile", "verl compiles its entropy function; hybridrl's compile switch is "
             "model.use_torch_compile (decoder layers)"),
    NoEffect(ARR + "actor.entropy_from_logits_with_chunking", "memory only: entropy is computed from the whole logits"),
    NoEffect(ARR + "actor.entropy_checkpointing", "memory only: entropy is not recomputed in backward"),
    NoEffect(ARR + "actor.calculate_entropy", "entropy is always computed and logged (actor/entropy)"),
    NoEffect(ARR + "actor.data_loader_seed", "mini-batch shuffling is seeded by trainer.seed and the step"),
    NoEffect(ARR + "actor.checkpoint.", _CHECKPOINT),
    NoEffect(ARR + "actor.profiler.", _PROFILER),
    NoEffect(ARR + "actor.calculate_sum_pi_squared", "not computed", ("false",)),
    NoEffect(ARR + "actor.sum_pi_squared_checkpointing", "not computed", ("false",)),
    Unsupported(ARR + "actor.ppo_micro_batch_size", "the global micro-batch size is deprecated in verl too: set "
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", ("null",)),
    Unsupported(ARR + "actor.loss_scale_factor", "seq-mean-token-sum-norm divides by data.max_response_length",
                ("null",)),
    Unsupported(ARR + "actor.tau_pos", "SAPO's soft gate is not implemented; actor.policy_loss is vanilla, gspo or "
                "cispo", ("1.0", "1")),
    Unsupported(ARR + "actor.tau_neg", "SAPO's soft gate is not implemented", ("1.05",)),
    Unsupported(ARR + "actor.policy_loss.", "only the loss mode carries over (actor.policy_loss); clip-cov and kl-cov "
                "losses are not implemented"),
    Moved(ARR + "actor.router_replay.mode", "actor.router_replay.mode"),
    Unsupported(ARR + "actor.router_replay.", "routing records are not written to or read from files; only "
                "actor.router_replay.mode carries over", ("null",)),
    Moved(ARR + "actor.fsdp_config.", "actor.fsdp."),
    Moved(ARR + "actor.", "actor."),
    # ---------------------------------------------------------------------------------------- actor_rollout_ref.ref
    Moved(ARR + "ref.fsdp_config.param_offload", "ref.param_offload"),
    Moved(ARR + "ref.rollout_n", "rollout.n"),
    NoEffect(ARR + "ref.fsdp_config.", "the reference is sharded like the actor; only param_offload is its own"),
    NoEffect(ARR + "ref.log_prob_use_dynamic_bsz", "reference passes form micro-batches like the actor "
             "(actor.use_dynamic_bsz)"),
    NoEffect(ARR + "ref.log_prob_max_token_len_per_gpu", "memory only: reference passes use the actor's token budget"),
    NoEffect(ARR + "ref.ulysses_sequence_parallel_size", "the reference runs in the actor's workers and splits "
             "sequences as the actor does (actor.ulysses_sequence_parallel_size)"),
    NoEffect(ARR + "ref.strategy", "FSDP2 is the only backend", ("fsdp", "fsdp2")),
    NoEffect(ARR + "ref.use_torch_compile", "hybridrl's compile switch is model.use_torch_compile"),
    NoEffect(ARR + "ref.entropy_from_logits_with_chunking", "the reference computes no entropy"),
    NoEffect(ARR + "ref.entropy_checkpointing", "the reference computes no entropy"),
    NoEffect(ARR + "ref.profiler.", _PROFILER),
    Unsupported(ARR + "ref.log_prob_micro_batch_size", "set actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                ("null",)),
    Unsupported(ARR + "ref.router_replay.", "the reference policy routes on its own (routing replay is the actor's: "
                "actor.router_replay.mode)", ("disabled", "null")),
    Moved(ARR + "ref.", "ref."),
    # ---------------------------------------------------------------------------------------- actor_rollout_ref.rollout
    Moved(ARR + "rollout.log_prob_micro_batch_size_per_gpu", "actor.log_prob_micro_batch_size_per_gpu"),
    Moved(ARR + "rollout.prompt_length", "data.max_prompt_length"),
    Moved(ARR + "rollout.response_length", "data.max_response_length"),
    Moved(ARR + "rollout.dtype", "model.dtype", {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}),
    Moved(ARR + "rollout.load_format", "rollout.load_format", {"dummy_dtensor": "dummy", "dummy_hf": "dummy",
                                                               "dummy_megatron": "dummy"}),
    Moved(ARR + "rollout.checkpoint_engine.update_weights_bucket_megabytes", "rollout.weight_sync_bucket_mb"),
    NoEffect(ARR + "rollout.log_prob_use_dynamic_bsz", "log-prob passes form micro-batches like the update "
             "(actor.use_dynamic_bsz)"),
    NoEffect(ARR + "rollout.log_prob_max_token_len_per_gpu", "memory only: log-prob passes use "
             "actor.ppo_max_token_len_per_gpu"),
    NoEffect(ARR + "rollout.mode", "hybridrl's rollout engine runs inside the actor worker (no separate server)",
             ("sync", "async")),
    NoEffect(ARR + "rollout.layered_summon", "weights stream into the engine in buckets of "
             "rollout.weight_sync_bucket_mb, never gathered whole on a rank (rollout.weight_transfer)"),
    NoEffect(ARR + "rollout.do_sample", "training rollouts always sample (rollout.temperature > 0); validation "
             "follows rollout.val_kwargs.do_sample", ("true",)),
    NoEffect(ARR + "rollout.ignore_eos", "responses end at EOS", ("false",)),
    NoEffect(ARR + "rollout.disable_log_stats", "vLLM's periodic stats are off"),
    NoEffect(ARR + "rollout.cudagraph_capture_sizes", "vLLM's own capture sizes (when rollout.enforce_eager=false)"),
    NoEffect(ARR + "rollout.multi_stage_wake_up", "the engine wakes weights and KV cache together"),
    NoEffect(ARR + "rollout.skip_tokenizer_init", "prompts go to the engine as token ids either way"),
    NoEffect(ARR + "rollout.scheduling_policy", "vLLM's first-come-first-served", ("fcfs",)),
    NoEffect(ARR + "rollout.logprobs_mode", "the engine returns processed log-probs", ("processed_logprobs",)),
    NoEffect(ARR + "rollout.max_model_len", "the engine's limit is data.max_prompt_length + "
             "data.max_response_length", ("null",)),
    NoEffect(ARR + "rollout.data_parallel_size", "one engine per rank", ("1",)),
    NoEffect(ARR + "rollout.expert_parallel_size", "no expert parallelism", ("1",)),
    NoEffect(ARR + "rollout.pipeline_model_parallel_size", "no pipeline parallelism in the engine", ("1",)),
    NoEffect(ARR + "rollout.over_sample_rate", "every requested response is generated", ("0", "0.0")),
    NoEffect(ARR + "rollout.calculate_log_probs", "the engine's log-probs are always recorded (the log_prob_diff check, "
             "algorithm.off_policy_correction)", ("false",)),
    NoEffect(ARR + "rollout.skip_rollout", "rollouts are always generated", ("false",)),
    NoEffect(ARR + "rollout.skip_dump_dir", "rollouts are not dumped"),
    NoEffect(ARR + "rollout.enable_rollout_routing_replay", "the rollout records routing whenever "
             "actor.router_replay.mode is R3 or record", ("false", "true")),
    NoEffect(ARR + "rollout.trace.", "no rollout tracing backend"),
    NoEffect(ARR + "rollout.checkpoint_engine.backend", "weights move by the resharder (gloo on CPU, NCCL on GPU)",
             ("naive",)),
    NoEffect(ARR + "rollout.checkpoint_engine.engine_kwargs", "no engine arguments", ("{}",)),
    NoEffect(ARR + "rollout.agent.num_workers", "single-turn generation runs in the actor worker (no agent loop "
             "workers)"),
    NoEffect(ARR + "rollout.agent.default_agent_loop", "the loop follows rollout.multi_turn.enable: single-turn "
             "generation when off, tool and environment episodes (verl's tool_agent) when on",
             ("single_turn_agent",)),
    Moved(ARR + "rollout.multi_turn.enable", "rollout.multi_turn.enable"),
    Moved(ARR + "rollout.multi_turn.max_assistant_turns", "rollout.multi_turn.max_assistant_turns"),
    NoEffect(ARR + "rollout.profiler.", _PROFILER),
    Moved(ARR + "rollout.multi_turn.tool_config_path", "rollout.multi_turn.tool_config_path"),
    Moved(ARR + "rollout.multi_turn.max_parallel_calls", "rollout.multi_turn.max_tool_calls_per_turn"),
    Moved(ARR + "rollout.multi_turn.tokenization_sanity_check_mode", "rollout.multi_turn.strict",
          {"strict": "true", "disable": "false", "ignore_strippable": "false"}),
    NoEffect(ARR + "rollout.multi_turn.format", "tool calls are parsed in the Hermes format", ("hermes",)),
    NoEffect(ARR + "rollout.multi_turn.use_inference_chat_template", "the ids trained are always the ids generated "
             "(observations are rendered by the chat template, checked against the ids so far)", ("false",)),
    Unsupported(ARR + "rollout.multi_turn.", "hybridrl's tools are rollout.multi_turn.tools (built-in) or "
                "rollout.multi_turn.tool_config_path (verl's file format), its environments registered by name "
                "(rollout.multi_turn.environment, a row's agent_name); verl's interaction_config_path files and "
                "user turns are not read", ("null",)),
    Unsupported(ARR + "rollout.agent.agent_loop_config_path", "verl's agent-loop classes are not loaded: "
                "multi-turn episodes run in hybridrl's agent loop (rollout.multi_turn.enable=true), their tools from "
                "rollout.multi_turn.tool_config_path (verl's tool file format) or rollout.multi_turn.tools, other "
                "environments registered by name in a trainer.plugins file (rollout.multi_turn.environment, a "
                "row's agent_name)", ("null",)),
    Unsupported(ARR + "rollout.agent.", "verl's agent-loop workers are not used: multi-turn episodes run in "
                "hybridrl's agent loop (rollout.multi_turn.*)"),
    Unsupported(ARR + "rollout.engine_kwargs.", "vLLM's arguments are set through rollout.* keys (gpu_memory_"
                "utilization, max_num_seqs, max_num_batched_tokens, block_size, enforce_eager, "
                "enable_chunked_prefill, ...)", ("{}",)),
    Unsupported(ARR + "rollout.log_prob_micro_batch_size", "set actor_rollout_ref.rollout."
                "log_prob_micro_batch_size_per_gpu", ("null",)),
    Moved(ARR + "rollout.", "rollout."),
    # ---------------------------------------------------------------------------------------- actor_rollout_ref
    NoEffect(ARR + "hybrid_engine", "the actor and its rollout engine always share the workers", ("true",)),
    NoEffect(ARR + "nccl_timeout", "worker calls time out after trainer.ray.call_timeout_s"),
    Moved(ARR + "model.", "model."),
    # ---------------------------------------------------------------------------------------- critic
    Moved("critic.model.path", "critic.model_path"),
    Moved("critic.model.enable_gradient_checkpointing", "model.enable_gradient_checkpointing"),
    Moved("critic.model.use_remove_padding", "model.use_remove_padding"),
    Moved("critic.model.trust_remote_code", "model.trust_remote_code"),
    Moved("critic.model.external_lib", "trainer.plugins"),
    Moved("critic.optim.clip_grad", "critic.grad_clip"),
    Moved("critic.optim.lr_scheduler_type", "critic.optim.lr_scheduler"),
    Moved("critic.optim.warmup_style", "critic.optim.lr_scheduler"),
    Moved("critic.shuffle", "actor.shuffle"),
    Moved("critic.rollout_n", "rollout.n"),
    Moved("critic.strategy", "actor.strategy", {"fsdp": "fsdp2", "fsdp2": "fsdp2"}),
    Moved("critic.model.fsdp_config.", "critic.fsdp."),
    NoEffect("critic.model.tokenizer_path", "the critic reads the policy's token ids (model.tokenizer_path)"),
    NoEffect("critic.model.use_shm", "start-up speed only"),
    NoEffect("critic.model.enable_activation_offload", "activation offload is not implemented", ("false",)),
    NoEffect("critic.model.override_config", "no config overrides", ("{}",)),
    NoEffect("critic.model.lora_rank", "the critic trains all its weights", ("0",)),
    NoEffect("critic.model.lora_alpha", "the critic has no LoRA"),
    NoEffect("critic.model.target_modules", "the critic has no LoRA"),
    NoEffect("critic.model.tiled_mlp.", "tiled MLPs are not implemented", ("false", "4")),
    NoEffect("critic.forward_micro_batch_size_per_gpu", "value passes use critic.ppo_micro_batch_size_per_gpu"),
    NoEffect("critic.forward_max_token_len_per_gpu", "memory only: value passes use critic.ppo_max_token_len_per_gpu"),
    NoEffect("critic.data_loader_seed", "mini-batch shuffling is seeded by trainer.seed and the step"),
    NoEffect("critic.checkpoint.", _CHECKPOINT),
    NoEffect("critic.profiler.", _PROFILER),
    Unsupported("critic.ppo_micro_batch_size", "set critic.ppo_micro_batch_size_per_gpu", ("null",)),
    Unsupported("critic.forward_micro_batch_size", "set critic.ppo_micro_batch_size_per_gpu", ("null",)),
    # ---------------------------------------------------------------------------------------- reward
    Moved("reward_model.model.path", "reward_model.model_path"),
    NoEffect("reward_model.overlong_buffer.log", "the penalty is always logged (reward/overlong_penalty_mean)"),
    Moved("reward_model.overlong_buffer.", "algorithm.overlong_buffer."),
    NoEffect("reward_model.reward_kwargs.overlong_buffer_cfg.log", "the penalty is always logged "
             "(reward/overlong_penalty_mean)"),
    Moved("reward_model.reward_kwargs.overlong_buffer_cfg.", "algorithm.overlong_buffer."),
    NoEffect("reward_model.reward_kwargs.max_resp_len", "the overlong buffer ends at data.max_response_length"),
    Moved("reward_model.reward_kwargs.", "custom_reward_function.reward_kwargs."),
    NoEffect("reward_model.reward_manager", "hybridrl scores each response by its data_source, as verl's naive "
             "manager does; DAPO's overlong penalty is algorithm.overlong_buffer (reward_model.overlong_buffer "
             "moves there); scoring runs in a process pool, like prime's", ("naive", "dapo", "prime")),
    NoEffect("reward_manager.name", "as reward_model.reward_manager", ("naive", "dapo", "prime")),
    NoEffect("reward_manager.source", "built-in scorers, or custom_reward_function", ("register",)),
    NoEffect("reward_manager.module.", "custom reward managers are not loaded: use custom_reward_function"),
    NoEffect("reward_model.model.input_tokenizer", "the reward model re-tokenises the decoded text with its own "
             "tokenizer"),
    NoEffect("reward_model.model.use_remove_padding", "memory only"),
    NoEffect("reward_model.model.trust_remote_code", "the reward model is loaded without remote code", ("false",)),
    NoEffect("reward_model.model.use_shm", "start-up speed only"),
    NoEffect("reward_model.model.fsdp_config.", "the reward model is sharded like the other roles"),
    NoEffect("reward_model.strategy", "FSDP2 is the only backend", ("fsdp", "fsdp2")),
    NoEffect("reward_model.enable_resource_pool", "the reward model's own devices are reward_model.n_gpus",
             ("false",)),
    NoEffect("reward_model.n_gpus_per_node", "used by verl only with enable_resource_pool; hybridrl's is "
             "reward_model.n_gpus"),
    NoEffect("reward_model.nnodes", "used by verl only with enable_resource_pool"),
    NoEffect("reward_model.max_length", "the reward model sees the whole prompt and response", ("null",)),
    NoEffect("reward_model.launch_reward_fn_async", "rewards are scored in a process pool", ("false",)),
    NoEffect("reward_model.ulysses_sequence_parallel_size", _SP, ("1",)),
    NoEffect("reward_model.profiler.", _PROFILER),
    Unsupported("reward_model.sandbox_fusion.", "code-execution rewards go in a custom_reward_function",
                ("null",)),
    Unsupported("reward_model.rollout.", "generative reward models are not implemented"),
    NoEffect("reward_model.use_reward_loop", "rewards are scored in the controller's process pool"),
    NoEffect("reward_model.num_workers", "the pool's size follows the machine"),
    Unsupported("reward_model.reward_loop_", "custom reward loops are not loaded: use custom_reward_function",
                ("null", "register")),
    Unsupported("reward_model.micro_batch_size", "set reward_model.micro_batch_size_per_gpu", ("null",)),
    NoEffect("reward_model.use_dynamic_bsz", "reward-model passes use a fixed micro-batch"),
    NoEffect("reward_model.forward_max_token_len_per_gpu", "reward-model passes use a fixed micro-batch"),
    # ---------------------------------------------------------------------------------------- algorithm
    NoEffect("algorithm.use_pf_ppo", "preference-feedback PPO reweighting is not implemented", ("false",)),
    Unsupported("algorithm.pf_ppo.", "preference-feedback PPO reweighting is not implemented"),
    Unsupported("algorithm.rollout_correction.", "set hybridrl's algorithm.off_policy_correction instead (kind: "
                "tis | mis, level: token | sequence, cap, low, high)", ("null", "false")),
    # ---------------------------------------------------------------------------------------- data
    Moved("data.tokenizer", "model.tokenizer_path"),
    Moved("data.trust_remote_code", "model.trust_remote_code"),
    NoEffect("data.use_shm", "start-up speed only"),
    NoEffect("data.reward_fn_key", "rewards are routed by data_source", ("data_source",)),
    NoEffect("data.return_raw_input_ids", "verl's dataset internals"),
    NoEffect("data.return_raw_chat", "verl's dataset internals"),
    NoEffect("data.return_full_prompt", "verl's dataset internals"),
    NoEffect("data.dataloader_num_workers", "prompts are read and tokenised once, in the controller"),
    NoEffect("data.filter_overlong_prompts_workers", "prompts are filtered once, in the controller"),
    NoEffect("data.validation_shuffle", "validation metrics do not depend on the order"),
    NoEffect("data.video_key", _IMAGES_ONLY),
    NoEffect("data.image_patch_size", "the image processor saved with the model sets the patch size"),
    NoEffect("data.return_multi_modal_inputs", "rows with images always carry their multi_modal_inputs", ("true",)),
    NoEffect("data.train_max_samples", "every row is used", ("-1",)),
    NoEffect("data.val_max_samples", "every row is used", ("-1",)),
    Moved("data.tool_config_path", "rollout.multi_turn.tool_config_path"),
    Unsupported("data.custom_cls.", "a custom dataset class is not loaded: write verl-schema parquet or JSONL files",
                ("null",)),
    Unsupported("data.sampler.", "a custom sampler is not loaded (data.shuffle, data.replay)", ("null",)),
    Unsupported("data.datagen.", "a data generator is not loaded (data.synthetic_task)", ("null",)),
    Unsupported("data.apply_chat_template_kwargs", "the tokenizer's chat template runs without extra arguments",
                ("{}",)),
    # ---------------------------------------------------------------------------------------- trainer and the rest
    Moved("trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    Moved("trainer.max_critic_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    Moved("trainer.ray_wait_register_center_timeout", "trainer.ray.startup_timeout_s"),
    Moved("ray_kwargs.ray_init.num_cpus", "trainer.ray.num_cpus"),
    NoEffect("ray_kwargs.timeline_json_file", "no Ray timeline dump", ("null",)),
    NoEffect("trainer.use_legacy_worker_impl", "selects between verl's own worker implementations; hybridrl has one"),
    NoEffect("trainer.log_val_generations", "three validation samples are logged at every validation"),
    NoEffect("trainer.esi_redundant_time", "no preemption-aware saving; use trainer.save_freq"),
    NoEffect("trainer.del_local_ckpt_after_load", "checkpoints are kept (trainer.max_ckpt_to_keep)", ("false",)),
    NoEffect("trainer.val_only", "trainer.val_before_train validates before the first step", ("false",)),
    Unsupported("trainer.default_hdfs_dir", "checkpoints go to trainer.default_local_dir; copy them to HDFS "
                "yourself", ("null",)),
    Unsupported("trainer.rollout_data_dir", "rollouts are not dumped; validation samples are logged", ("null",)),
    Unsupported("trainer.validation_data_dir", "validation generations are not dumped", ("null",)),
    NoEffect("transfer_queue.enable", "no transfer queue", ("false",)),
    NoEffect("global_profiler.", _PROFILER),
)
"""Every rule, exact keys and prefixes together; :func:`rule_for` takes an exact key first, else the longest
prefix."""

VERL_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    ("algorithm.adv_estimator", "gae", "verl's default estimator"),
    ("rollout.n", "1", "verl samples one response per prompt unless told"),
    ("data.train_batch_size", "1024", ""),
    ("actor.ppo_mini_batch_size", "256", ""),
    ("actor.shuffle", "false", "verl does not shuffle within a step by default"),
    ("critic.ppo_mini_batch_size", "${actor.ppo_mini_batch_size}", "verl's critic follows the actor"),
    ("critic.ppo_epochs", "${actor.ppo_epochs}", "verl's critic follows the actor"),
    ("critic.use_dynamic_bsz", "${actor.use_dynamic_bsz}", "verl's critic follows the actor"),
    ("critic.loss_agg_mode", "${actor.loss_agg_mode}", "verl's critic follows the actor"),
    ("critic.ppo_max_token_len_per_gpu", "32768", ""),
    ("data.filter_overlong_prompts", "false", ""),
    ("model.enable_gradient_checkpointing", "true", ""),
    ("model.use_remove_padding", "true", ""),
    ("trainer.total_epochs", "30", ""),
)
"""``(our key, value, why)``: verl's defaults that differ from hybridrl's and that change what a verl script means,
applied (below the script's own overrides) when the overrides use verl's layout. Sizes that only tune speed
(``rollout.tensor_model_parallel_size``, ``rollout.enforce_eager``) keep hybridrl's defaults."""


def rule_for(verl_key: str) -> Optional[Rule]:
    """The rule for one verl key: its exact rule, else the longest prefix rule that covers it, else ``None``."""
    exact = _EXACT.get(verl_key)
    if exact is not None:
        return exact
    covering = [rule for rule in _PREFIXES if verl_key.startswith(rule.verl)]
    return max(covering, key=lambda rule: len(rule.verl)) if covering else None


def uses_verl_layout(key: str) -> bool:
    """Whether a key is spelt the verl way (it has a rule); keys spelt alike in both have none."""
    return rule_for(key) is not None


_EXACT = {rule.verl: rule for rule in RULES if not rule.verl.endswith((".", "_"))}
_PREFIXES = tuple(rule for rule in RULES if rule.verl.endswith((".", "_")))

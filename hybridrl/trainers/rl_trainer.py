"""The RL trainer: the PPO/GRPO dataflow written as plain Python on the single controller (docs/architecture.md §2).

    prompts → generate → reward → old/ref log-probs, values → (KL in reward) → advantages → critic / actor update

Each heavy call goes to a worker group; everything between calls is tensor math on the driver
(``rl_steps``). ``fit`` adds validation, tracking, checkpoints and exact resume around the loop.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from hybridrl.config import critic_enabled, dump_config, validate_config, world_size
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import AUTO_MICRO_BATCH, reuses_update_log_probs
from hybridrl.runtime import ResourcePoolManager, WorkerError, WorkerGroup, gather, release_parked_workers, start_ray
from hybridrl.trainers.checkpoints import CheckpointManager, load_trainer_state, resume_checkpoint
from hybridrl.trainers.continual import PromptReplay, PtxBatches
from hybridrl.trainers.faults import FaultInjector, NonFiniteGuard
from hybridrl.trainers.health import HealthMonitor
from hybridrl.trainers.rl_setup import kl_controller_for
from hybridrl.trainers.restarts import RESTARTABLE, RestartRecord, Supervisor
from hybridrl.trainers.run_lock import run_directory_lock
from hybridrl.trainers.scaffold import open_tracker, resume_point
from hybridrl.rewards.judge import JudgeClient
from hybridrl.rewards.judge_server import judge_for_run
from hybridrl.trainers.reward_fusion import FusedScoring, fusion_enabled, reward_model_tokenizer
from hybridrl.trainers.rl_steps import (apply_kl_in_reward, balance_batch, compute_advantages, off_policy_corrected,
                                        trained_batch_metrics, with_distillation)
from hybridrl.trainers.evaluation import Scoring, validate
from hybridrl.trainers.async_rollout import SAMPLE_LOG_STEPS, RolloutQueue, refuse_a_queue_outside_the_bound
from hybridrl.trainers.generation import Generation
from hybridrl.replicas import Generators, role_pools, start_generators
from hybridrl.agents.episode_rows import episode_rows
from hybridrl.trainers.variants import (concat_rollouts, group_filter, first_groups, keep_groups, num_groups,
                                          prompts_without_greedy, remax_baselines, remax_params, shape_rewards)
from hybridrl.data.images import image_reader
from hybridrl.data.loader import build_prompt_loaders
from hybridrl.protocol import Batch, Fields
from hybridrl.rewards.custom import RewardFunctionSource
from hybridrl.rewards.registry import check_data_sources
from hybridrl.rewards.scorer import build_reward_scorer
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.seeding import derive_seed
from hybridrl.utils.timing import PhaseTimer
from hybridrl.utils.tracking import Tracker, read_metrics
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.workers.critic_worker import CriticWorker
from hybridrl.workers.reward_model_worker import RewardModelWorker
from hybridrl.workers.agent_rollout import check_agent_names, episode_runner
from hybridrl.modeling.model_builder import load_tokenizer

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What ``fit`` returns: where the run lives, how far it got, and its validation figures."""

    run_dir: Path
    global_step: int
    history: list[dict[str, float]] = field(default_factory=list)
    first_validation: Optional[dict[str, float]] = None
    last_validation: Optional[dict[str, float]] = None
    restarts: list[RestartRecord] = field(default_factory=list)
    export_dir: Optional[Path] = None

    def metric_rows(self) -> list[dict[str, float]]:
        """One dict per logged step, with its ``step``: the run's ``metrics.jsonl`` when the ``jsonl`` logger wrote
        one (the whole run, resumed parts and the step-0 validation included), else the steps this process trained."""
        if (self.run_dir / "metrics.jsonl").is_file():
            return read_metrics(self.run_dir)
        first = self.global_step - len(self.history)
        return [{"step": first + index + 1, **metrics} for index, metrics in enumerate(self.history)]


class RLTrainer:
    """PPO / GRPO (and the other estimators) on Ray worker groups. Build with a validated, frozen ``TrainConfig``."""

    def __init__(self, config: TrainConfig) -> None:
        if not config.is_frozen:  # built in Python (a notebook): validate it like the CLI would, then freeze it
            validate_config(config)
            config.freeze()
        self.config = config
        self.run_dir = Path(config.trainer.default_local_dir)
        self.tokenizer = load_tokenizer(config.model)
        episodes = episode_runner(config, self.tokenizer)  # a chat template that cannot show the tools: refused now
        self.loaders = build_prompt_loaders(config.data, self.tokenizer, image_reader(config.model.path))
        reward_source = RewardFunctionSource.from_config(config.custom_reward_function)
        reward_source.load()  # a bad reward file, name or keyword fails now, before Ray starts
        for loader in filter(None, self.loaders):
            check_agent_names(config, loader.dataset, episodes and [tool.name for tool in episodes.tools])
        # every prompt's data_source needs a reward function, now (a user's agent may score its episodes itself)
        if reward_source.is_builtin and not config.rollout.multi_turn.agent:
            for loader in filter(None, self.loaders):
                check_data_sources(sorted({prompt.data_source for prompt in loader.dataset}))
        self.total_steps = config.trainer.total_training_steps or \
            config.trainer.total_epochs * self.loaders.train.steps_per_epoch
        self.kl_controller = kl_controller_for(config, self.total_steps)
        self.checkpoints = CheckpointManager(self.run_dir, config.trainer.max_ckpt_to_keep)
        self.with_reference = config.actor.use_kl_loss or config.algorithm.use_kl_in_reward
        self.ptx = PtxBatches(config, self.tokenizer) if config.actor.ptx.coef > 0 else None
        self.replay = PromptReplay.from_config(config, self.loaders.train.pad_token_id)
        self.queue: Optional[RolloutQueue] = None  # the batches generated for the next steps (η ahead; 0 in sync)
        self._last_generator_check: Optional[float] = None
        self.sample_log: deque = deque(maxlen=SAMPLE_LOG_STEPS)  # what each step trained (RolloutQueue)
        self.global_step = self.first_step = 0  # first_step: where this process's run started (after a resume)
        self.initial_state = self._controller_state()  # what a restart before the first checkpoint goes back to
        self.restart_point: Optional[Path] = None  # the checkpoint a restart resumes from (last loaded or committed)
        self.faults = FaultInjector(config.trainer.fault_injection)
        self.health = HealthMonitor(config.trainer.health)
        self.pools: Optional[ResourcePoolManager] = None
        self.actor: Optional[WorkerGroup[ActorRolloutRefWorker]] = None
        self.generators: Optional[Generators] = None  # the actor group and the replicas, started together
        self.generation: Optional[Generation] = None
        self.critic: Optional[WorkerGroup[CriticWorker]] = None
        self.reward_model: Optional[WorkerGroup[RewardModelWorker]] = None
        self.judge: Optional[JudgeClient] = None

    # ------------------------------------------------------------------ the run
    def fit(self) -> TrainResult:
        """Train for ``total_steps`` (resuming if configured), validating and checkpointing as configured. The run
        directory is held for the whole run: a second run in it is refused."""
        result, trainer = TrainResult(self.run_dir, 0), self.config.trainer
        supervisor = Supervisor(trainer.max_restarts)
        refuse_a_queue_outside_the_bound(resume_checkpoint(trainer.resume_mode, self.checkpoints.root.parent,
                                                           trainer.resume_from_path),
                                         self.config.async_training.staleness_bound, self.config.async_training.mode)
        with run_directory_lock(self.run_dir), start_ray(self.config.trainer.ray) as runtime, \
                build_reward_scorer(self.config.custom_reward_function) as scorer, \
                judge_for_run(self.config.reward_judge) as self.judge:
            dump_config(self.config, self.run_dir)
            self.rule_scoring = self.scoring = Scoring(scorer, self.tokenizer)
            supervisor.run(lambda: self._attempt(runtime, result, supervisor), lambda: self.global_step)
        result.global_step, result.restarts = self.global_step, supervisor.records
        return result

    def _attempt(self, runtime, result: TrainResult, supervisor: Supervisor) -> None:
        """Start the workers, restore the state (a resume, or after a lost worker the last checkpoint), train."""
        trainer, tracker = self.config.trainer, None
        try:
            if supervisor.restarting:  # after a lost worker, every group in fresh processes
                release_parked_workers()
            self._start_workers(runtime)
            if supervisor.restarting:
                self._restore(self.restart_point)
            else:
                self._resume()
                self.first_step = self.global_step
            supervisor.resumed(self.restart_point, self.global_step)
            del result.history[self.global_step - self.first_step:]  # steps after the checkpoint run again
            tracker = open_tracker(trainer, self.run_dir, total_steps=self.total_steps, start_step=self.global_step,
                                   monitoring=trainer.monitoring, num_devices=world_size(self.config))
            self._train_loop(tracker, result)
            if trainer.export_at_end:
                result.export_dir = Path(self._actor().call(ActorRolloutRefWorker.export_hf, str(self.run_dir / "hf")))
        finally:
            if tracker is not None:
                tracker.close()
            self._stop_workers()

    def _train_loop(self, tracker: Tracker, result: TrainResult) -> None:
        trainer = self.config.trainer
        guard = NonFiniteGuard(trainer.max_consecutive_nonfinite_steps)
        if trainer.val_before_train and self.global_step == 0 and self.loaders.val is not None:
            result.first_validation = self.validate()
            tracker.log(result.first_validation, step=0)
        while self.global_step < self.total_steps:
            metrics = self.train_step()
            self.global_step += 1
            if self._due(trainer.test_freq) or self.global_step == self.total_steps:
                result.last_validation = self.validate() if self.loaders.val is not None else None
                metrics.update(result.last_validation or {})
            metrics.update(self.health.observe(self.global_step, metrics))
            tracker.log(metrics, step=self.global_step)
            result.history.append(metrics)
            guard.observe(self.global_step, metrics, self.restart_point)
            if self._due(trainer.save_freq) or (self.global_step == self.total_steps and trainer.save_at_end):
                self.save_checkpoint()
            self.health.raise_if_stopping()

    def train_step(self) -> dict[str, float]:
        """One PPO/GRPO step; returns its metrics. One pipeline for every mode: the producer (:class:`RolloutQueue`)
        draws, and generates the batches of steps up to η ahead (``async_training``; η = 0 in sync: this step's
        batch, now, with the weights of the last update); the consumer scores this step's batch, filters its
        groups (dynamic sampling), and trains on it."""
        assert self.queue is not None
        timer = PhaseTimer()
        self._pop_worker_metrics()  # calls made since the last step (validation, a resume) are not this step's
        with timer.phase("generate"):
            entry, queue_metrics = self.queue.take(self.global_step)
        with timer.phase("reward"):
            batch, reward_metrics = self._score(entry.result())
        batch, reward_metrics = self._filter_groups(batch, reward_metrics, entry.params, timer)
        asynchronous = self.config.async_training.mode != "sync"
        metrics = self._train_on(batch, entry.params, timer, {**(queue_metrics if asynchronous else {}),
                                                              **entry.draw_metrics, **reward_metrics},
                                 greedy=entry.greedy_result())
        if asynchronous:
            metrics["async/trainer_idle_fraction"] = metrics["timing/generate"] / max(timer.total(), 1e-9)
            metrics.update(self._generator_idle())
        return metrics

    def _train_on(self, batch: Batch, params: SamplingParams, timer: PhaseTimer, extra: dict[str, float],
                  greedy: Optional[Batch] = None) -> dict[str, float]:
        """Log-probs, advantages and the updates on a generated, scored batch; the step's metrics. ``greedy``
        (ReMax): prompts' greedy responses, generated with the weights that sampled their rows by the queue, right
        behind the batch; those of prompts it lacks (dynamic sampling's refills) are generated here with the current
        weights, which generated those rows, before anything reorders the rows."""
        config, actor = self.config, self._actor()
        temperature = params.effective_temperature  # log-probs are of the distribution the rollout sampled from
        greedy_batches = []
        if config.algorithm.adv_estimator == "remax":
            with timer.phase("generate"):
                greedy_batches = self._greedy_responses(batch, greedy)
        # An agent's episodes: each its rollout.multi_turn.agent_max_sequences rows (agents/episode_rows.py).
        batch = episode_rows(batch, config.rollout.multi_turn.agent_max_sequences, self.tokenizer.pad_token_id)
        # Balance tokens across DP ranks before any forward (only reorders rows; groups are found by uid).
        batch = balance_batch(batch, world_size(config)) if config.trainer.balance_batch else batch
        with timer.phase("log_probs_and_values"):
            batch = self._old_log_probs_ref_and_values(batch, temperature)
        with timer.phase("advantages"):
            baselines = remax_baselines(batch, greedy_batches, config, self.scoring.token_level_scores) \
                if greedy_batches else None
            metrics = self._rewards_and_advantages(batch, baselines)
            self.faults.corrupt_advantages(self.global_step + 1, batch)
            actor_batch, correction_metrics = off_policy_corrected(batch, config.algorithm.off_policy_correction,
                                                                   config.async_training.staleness_bound)
        if self.critic is not None:
            with timer.phase("update_critic"):
                metrics.update(_prefixed("critic", self.critic.call(CriticWorker.update_critic, batch,
                                                                    step=self.global_step)[0]))
        self.faults.before_actor_update(self.global_step + 1, {"actor_rollout_ref": actor, "critic": self.critic,
                                                               **self._replica_groups()})
        metrics.update(self._update_actor_and_sync(actor_batch, temperature, timer))
        for extras in (extra, correction_metrics, trained_batch_metrics(batch, self.global_step), timer.metrics(),
                       self._pop_worker_metrics()):
            metrics.update(extras)
        metrics["perf/throughput_tokens_per_s"] = float(batch[Fields.ATTENTION_MASK].sum()) / max(
            timer.total(), 1e-9)
        return metrics

    def _update_actor_and_sync(self, actor_batch: Batch, temperature: float, timer: PhaseTimer) -> dict[str, float]:
        """The actor's update (after ``trainer.critic_warmup``) and the weight sync into the generating engines."""
        generation, metrics = self._generation(), {}
        if self.global_step < self.config.trainer.critic_warmup:  # no update: the next step's weights are these
            generation.advance(self.global_step + 1)
            return metrics
        with timer.phase("update_actor"):
            ptx = self.ptx.batch(self.global_step) if self.ptx is not None else None
            metrics.update(_prefixed("actor", self._actor().call(ActorRolloutRefWorker.update_actor, actor_batch,
                                                                 step=self.global_step, temperature=temperature,
                                                                 ptx=ptx)[0]))
        with timer.phase("weight_sync"):  # async: queued behind the generation in flight (metrics one step late)
            metrics.update(generation.sync_weights(self.global_step + 1,
                                                   wait=self.config.async_training.mode == "sync"))
        return metrics

    def validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) generation on the validation set, scored per data source."""
        params = SamplingParams.for_validation(self.config.rollout, self.config.data.max_response_length,
                                               seed=self.config.trainer.seed)
        return validate(self._generation().generate, self.loaders.val, self.scoring, params)

    # ------------------------------------------------------------------ steps between worker calls
    def _generate_and_score(self, prompts: Batch, params: SamplingParams, timer: PhaseTimer) -> tuple[Batch, dict]:
        with timer.phase("generate"):
            batch = self._generation().generate(prompts, params)
        with timer.phase("reward"):
            return self._score(batch)

    def _score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Token-level scores (and shaped rewards) of generated rows, in place; the reward metrics."""
        scores, metrics = self.scoring.token_level_scores(batch)
        batch[Fields.TOKEN_LEVEL_SCORES] = scores
        batch[Fields.SCORES] = scores.sum(-1)  # before shaping (filter_groups.metric=score)
        metrics.update(shape_rewards(batch, self.config))
        if self.replay is not None:
            self.replay.observe(batch)
        return batch, metrics

    def _filter_groups(self, batch: Batch, metrics: dict[str, float], params: SamplingParams,
                       timer: PhaseTimer) -> tuple[Batch, dict[str, float]]:
        """Dynamic sampling (``algorithm.filter_groups``) on a scored batch: keep its informative groups and
        generate more batches with the current weights (``data.gen_batch_size`` prompts from the loader, seeds
        derived from ``params``) until ``data.train_batch_size`` groups are collected; ``batch`` as it is without."""
        config, filtering = self.config, self.config.algorithm.filter_groups
        if not filtering.enable:
            return batch, metrics
        kept, attempts = [], 1
        while True:
            kept.append(keep_groups(batch, group_filter(filtering.metric)(batch)))
            collected = concat_rollouts(kept, self.tokenizer.pad_token_id)
            if num_groups(collected) >= config.data.train_batch_size:
                metrics["dapo/num_gen_batches"] = float(attempts)
                return first_groups(collected, config.data.train_batch_size), metrics
            if attempts >= filtering.max_num_gen_batches:
                raise RuntimeError(f"dynamic sampling found {num_groups(collected)} of {config.data.train_batch_size} "
                                   f"informative prompt groups in {attempts} generation batches; raise "
                                   "algorithm.filter_groups.max_num_gen_batches or rollout.n, or disable the filter")
            attempts += 1
            batch, _ = self._generate_and_score(next(iter(self.loaders.train)),
                                                params.with_seed(derive_seed(params.seed, "refill", attempts)), timer)

    def _draw_prompts(self, step: int) -> tuple[Batch, dict[str, float]]:
        """Step ``step``'s prompts, drawn by the queue: the loader's next batch with a share replaced by prompts
        replayed from earlier steps (``data.replay``), and the draw's metrics."""
        prompts = next(iter(self.loaders.train))
        return self.replay.mix(prompts, step) if self.replay is not None else (prompts, {})

    def _greedy_responses(self, batch: Batch, greedy: Optional[Batch]) -> list[Batch]:
        """ReMax: ``greedy`` (generated beside the batch) and, for the prompts of ``batch`` it lacks, their greedy
        responses generated now — one row per prompt in all."""
        missing = prompts_without_greedy(batch, greedy)
        fresh = [self._generation().generate(missing, remax_params(self.config))] if missing is not None else []
        return ([greedy] if greedy is not None else []) + fresh

    def _old_log_probs_ref_and_values(self, batch: Batch, temperature: float) -> Batch:
        """Start the old-log-prob, reference and value forwards together, then merge their outputs. The old-log-prob
        forward is skipped when the update is exactly on-policy (``actor.old_log_prob=auto``; the update then uses its
        own log-probs, detached)."""
        actor = self._actor()
        futures = [] if reuses_update_log_probs(self.config) else [
            actor.call_async(ActorRolloutRefWorker.compute_log_prob, batch, temperature)]
        if self.with_reference:
            futures.append(actor.call_async(ActorRolloutRefWorker.compute_ref_log_prob, batch, temperature))
        if self.config.algorithm.distillation.teacher_path:
            futures.append(actor.call_async(ActorRolloutRefWorker.compute_teacher_log_prob, batch, temperature))
        if self.critic is not None:
            futures.append(self.critic.call_async(CriticWorker.compute_values, batch))
        for output in gather(*futures):
            batch = batch.union(output)
        return batch

    def _rewards_and_advantages(self, batch: Batch, reward_baselines: Optional[torch.Tensor] = None) -> dict[str, float]:
        algorithm, metrics = self.config.algorithm, {}
        if algorithm.use_kl_in_reward:
            penalised = apply_kl_in_reward(batch, self.kl_controller.value, algorithm.kl_penalty)
            self.kl_controller.update(penalised.mean_sequence_kl, n_steps=len(batch))
            rewards, metrics = penalised.rewards, penalised.metrics()
        else:
            rewards = batch[Fields.TOKEN_LEVEL_SCORES]
        batch[Fields.TOKEN_LEVEL_REWARDS] = rewards
        advantages, returns = compute_advantages(batch, algorithm, reward_baselines)
        advantages = with_distillation(batch, advantages, algorithm.distillation, metrics)
        batch[Fields.ADVANTAGES], batch[Fields.RETURNS] = advantages, returns
        return metrics

    # ------------------------------------------------------------------ workers, checkpoints
    def _start_workers(self, runtime) -> None:
        config, started = self.config, time.perf_counter()
        self.pools = pools = role_pools(config)
        pools.create(runtime)
        share = 1.0 / len(pools.roles_in("global"))  # colocated roles: separate processes on each bundle
        generators = start_generators(config, pools, total_steps=self.total_steps, with_reference=self.with_reference,
                                      partial_rollout=config.async_training.partial_rollout)
        self.generators, self.actor = generators, generators.actor
        self.generation = Generation(generators.replicas, generators.transfer)
        self._last_generator_check = None  # a restart: idle shares count from the new workers' first step
        self.queue = RolloutQueue(self.generation, config.async_training.staleness_bound, self._draw_prompts,
                                  self._training_params, self.sample_log,
                                  greedy_params=remax_params(config) if config.algorithm.adv_estimator == "remax"
                                  else None)
        if critic_enabled(config):
            self.critic = WorkerGroup(CriticWorker, pools.pool_for("critic"), name="critic", bundle_share=share,
                                      args=(config, self.total_steps), sp_size=config.critic.ulysses_sequence_parallel_size)
        if config.reward_model.enable:
            own_pool = pools.role_to_pool["reward_model"] != "global"
            self.reward_model = WorkerGroup(RewardModelWorker, pools.pool_for("reward_model"), name="reward_model",
                                            bundle_share=1.0 if own_pool else share, args=(config,))
        if fusion_enabled(config):
            self.scoring = FusedScoring(self.rule_scoring, config, self.reward_model,
                                        reward_model_tokenizer(config, self.tokenizer), self.judge)
        logger.info("workers started in %.1f s", time.perf_counter() - started)
        self._log_micro_batch_sizing()

    def _replica_groups(self) -> dict[str, WorkerGroup]:
        """The replicas' own worker groups by name (fault injection kills them by name)."""
        replicas = self.generation.replicas if self.generation is not None else []
        return {group.name: group for replica in replicas for group in replica.groups()}

    def _log_micro_batch_sizing(self) -> None:
        """The workers' decision for ``ppo_micro_batch_size_per_gpu: auto`` (made at their start-up), one line each."""
        for role, group in (("actor", self.actor), ("critic", self.critic)):
            if group is not None and getattr(self.config, role).ppo_micro_batch_size_per_gpu == AUTO_MICRO_BATCH:
                logger.info("%s", group.call(group.worker_cls.batch_plan)[1])

    def _stop_workers(self) -> None:
        if self.generators is not None:
            self.generators.shutdown()  # the replicas, then the actor
        for group in (self.critic, self.reward_model):
            if group is not None:
                group.shutdown()
        self.generators, self.generation, self.queue = None, None, None
        if self.pools is not None:
            self.pools.release()

    def save_checkpoint(self) -> Path:
        """Checkpoint actor (+ critic) shards and the controller state; atomic, ``latest`` updated last.

        A failed write (a full disk, a worker's error) removes the partial directory and raises
        ``CheckpointWriteError`` naming the cause; the previous checkpoint and ``latest`` are untouched."""
        step = self.global_step
        try:
            directory = self.checkpoints.partial_dir(step)
            futures = [self._actor().call_async(ActorRolloutRefWorker.save_checkpoint, str(directory / "actor"))]
            if self.critic is not None:
                futures.append(self.critic.call_async(CriticWorker.save_checkpoint, str(directory / "critic")))
            gather(*futures)
            self.faults.before_checkpoint_commit(step, directory)
            self.restart_point = self.checkpoints.commit(step, {"model_path": self.config.model.path,
                                                                **self._controller_state()})
        except (OSError, WorkerError) as error:
            if isinstance(error, RESTARTABLE):  # a lost worker: the supervisor restarts, the partial is swept
                raise
            raise self.checkpoints.abort(step, error) from error
        return self.restart_point

    def _controller_state(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "loader": self.loaders.train.state_dict(),
                "kl_controller": self.kl_controller.state_dict(),
                **({"replay": self.replay.state_dict()} if self.replay is not None else {}),
                **({"rollout_queue": self.queue.state_dict()} if self.queue is not None else {}),
                **({"reward_fusion": self.scoring.state_dict()}
                   if isinstance(getattr(self, "scoring", None), FusedScoring) else {})}

    def _resume(self) -> None:
        trainer = self.config.trainer
        checkpoint, _ = resume_point(self.checkpoints, trainer.resume_mode, model_path=self.config.model.path,
                                     resume_from_path=trainer.resume_from_path)
        self._restore(checkpoint)

    def _restore(self, checkpoint: Optional[Path]) -> None:
        """Load ``checkpoint`` into the (freshly started) workers and the controller; ``None``: the initial state."""
        self.restart_point = checkpoint
        for stale in self.checkpoints.sweep_partials():  # a restart: the write that failed with the worker
            logger.warning("removed a half-written checkpoint left by a crash: %s", stale)
        state = self.initial_state if checkpoint is None else load_trainer_state(checkpoint)
        if checkpoint is not None:
            self._actor().call(ActorRolloutRefWorker.load_checkpoint, str(checkpoint / "actor"))
        if checkpoint is not None or self.config.rollout.load_format == "dummy":
            # a separate engine still holds model.path (or, load_format=dummy, random weights)
            self._generation().sync_weights(int(state["global_step"]))
        if checkpoint is not None:
            if self.critic is not None:
                self.critic.call(CriticWorker.load_checkpoint, str(checkpoint / "critic"))
            logger.info("resumed from %s at step %d", checkpoint, int(state["global_step"]))
        self.loaders.train.load_state_dict(state["loader"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        if self.replay is not None and "replay" in state:
            self.replay.load_state_dict(state["replay"])
        if self.queue is not None and "rollout_queue" in state:
            self.queue.load_state_dict(state["rollout_queue"])
        if isinstance(self.scoring, FusedScoring):
            self.scoring.load_state_dict(state.get("reward_fusion", {}))
        self.global_step = int(state["global_step"])

    def _pop_worker_metrics(self) -> dict[str, float]:
        """The actor's and critic's ``timing_worker/*`` and ``comm_bytes/*`` since the last pop
        (:meth:`~hybridrl.runtime.WorkerGroup.pop_call_metrics`)."""
        return {key: value for group in (self.actor, self.critic) if group is not None
                for key, value in group.pop_call_metrics().items()}

    def _generation(self) -> Generation:
        if self.generation is None:
            raise RuntimeError("workers are not started; call fit()")
        return self.generation

    def _actor(self) -> WorkerGroup[ActorRolloutRefWorker]:
        if self.actor is None:
            raise RuntimeError("workers are not started; call fit()")
        return self.actor

    def _due(self, frequency: int) -> bool:
        return frequency > 0 and self.global_step % frequency == 0

    def _training_params(self, step: int) -> SamplingParams:
        """Sampling of step ``step``'s batch: a different, reproducible seed every step (from ``rollout.seed``,
        else ``trainer.seed``)."""
        base = self.config.rollout.seed if self.config.rollout.seed is not None else self.config.trainer.seed
        return SamplingParams.for_training(self.config.rollout, self.config.data.max_response_length,
                                           seed=derive_seed(base, "step", step))

    def _generator_idle(self) -> dict[str, float]:
        """``async/generator_idle_fraction``: the share of the wall time since the last call that the replicas spent
        outside their generate and load calls (calls count when they finish; averaged over the live replicas)."""
        now, last = time.perf_counter(), self._last_generator_check
        self._last_generator_check = now
        readings = [seconds for seconds in (replica.busy_seconds() for replica in self._generation().live_replicas())
                    if seconds is not None]
        busy = sum(readings) / max(len(readings), 1)
        if last is None:
            return {}
        return {"async/generator_idle_fraction": max(0.0, 1.0 - busy / max(now - last, 1e-9))}


def _prefixed(prefix: str, metrics: dict[str, Any]) -> dict[str, float]:
    return {f"{prefix}/{name}": float(value) for name, value in metrics.items()}

"""Reward-model training (``hybridrl rm``): Bradley–Terry on preference pairs, on the FSDP2 worker stack.

The loop, on the controller::

    for step in steps:
        pairs = the step's train_batch_size pairs (a pure function of the step: reshuffled per epoch, seeded)
        metrics = reward_model.update(pairs)         # split over DP ranks → micro-batches → one optimizer step
        every test_freq steps: held-out rewards → val/accuracy, val/margin, val/loss
        every save_freq steps: checkpoint (resumable)
    export the reward model as a Hugging Face directory (loadable as reward_model.model_path of an RL run)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from hybridrl.algorithms.preference import bradley_terry_loss
from hybridrl.config.loader import dump_config
from hybridrl.config.monitoring import MonitoringConfig
from hybridrl.config.dpo_schema import DPOConfig
from hybridrl.config.rm_schema import RMConfig
from hybridrl.config.validation import resolved_device
from hybridrl.runtime import PoolSpec, WorkerGroup
from hybridrl.trainers.checkpoints import CheckpointManager
from hybridrl.trainers.run_lock import run_directory_lock
from hybridrl.trainers.scaffold import cluster, open_tracker, resume_point
from hybridrl.data.preference import (
    PairFields,
    PreferencePair,
    check_pair_lengths,
    encode_pairs,
    read_preference_pairs,
    split_held_out,
)
from hybridrl.data.synthetic import build_synthetic_task
from hybridrl.data.synthetic_preference import synthetic_pairs
from hybridrl.protocol import Batch
from hybridrl.utils.tracking import Tracker
from hybridrl.modeling.model_builder import load_tokenizer
from hybridrl.workers.rm_train_worker import RewardModelTrainWorker

logger = logging.getLogger(__name__)


@dataclass
class RMResult:
    """What ``fit`` returns: the run and export directories, per-step metrics, and the validations ``(step, metrics)``."""

    run_dir: Path
    export_dir: Path
    history: list[dict[str, float]] = field(default_factory=list)
    validations: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    global_step: int = 0


def load_pairs(config: RMConfig | DPOConfig, read: Callable[[Sequence[str]], list] = read_preference_pairs,
               from_pairs: Callable[[list[PreferencePair]], list] = list) -> tuple[list, list]:
    """``(train, held_out)`` pairs: from a synthetic task, or from files (held-out files, or a hashed prompt split).
    ``read`` reads files (KTO: labelled completions), ``from_pairs`` turns synthetic pairs into what it reads."""
    data = config.data
    if data.synthetic_task is not None:
        task = build_synthetic_task(data.synthetic_task, seed=data.seed, **dict(data.synthetic_task_kwargs))
        options = dict(seed=data.seed, spread=data.synthetic_spread)
        return (from_pairs(synthetic_pairs(task.train_rows(), data.synthetic_preference, **options)),
                from_pairs(synthetic_pairs(task.validation_rows(), data.synthetic_preference, **options)))
    train = read(data.train_files)
    if data.val_files:
        return train, read(data.val_files)
    train, held_out = split_held_out(train, data.val_fraction)
    if not train:
        raise ValueError(f"data.val_fraction={data.val_fraction} holds out every prompt of data.train_files")
    return train, held_out


def step_indices(num_pairs: int, batch_size: int, step: int, *, shuffle: bool, seed: int) -> list[int]:
    """Indices of the pairs of optimizer step ``step`` (0-based): consecutive slices of a per-epoch permutation
    (seeded by ``seed`` and the epoch); a step may run across an epoch boundary."""
    orders: dict[int, list[int]] = {}
    indices = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_pairs)
        if epoch not in orders:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            orders[epoch] = torch.randperm(num_pairs, generator=generator).tolist() if shuffle else list(range(num_pairs))
        indices.append(orders[epoch][offset])
    return indices


def validation_metrics(rewards: Batch) -> dict[str, float]:
    """``val/accuracy``, ``val/margin``, ``val/loss`` (unregularised Bradley–Terry) and mean rewards of held-out pairs."""
    chosen, rejected = rewards[PairFields.CHOSEN_REWARDS], rewards[PairFields.REJECTED_REWARDS]
    _, metrics = bradley_terry_loss(chosen, rejected, normalizer=len(chosen))
    return {f"val/{name}": float(value) for name, value in metrics.items()}


class RMTrainer:
    """Trains a reward model on preference pairs and exports it as a Hugging Face directory. A trainer of another
    model on the same pairs (``hybridrl dpo``) subclasses it with its own ``worker`` (and role and metric prefix),
    ``batch``, ``validate`` and ``_before_steps``."""

    worker = RewardModelTrainWorker
    role, prefix = "reward_model", "rm"

    def __init__(self, config: RMConfig) -> None:
        self.config = config
        self.run_dir = Path(config.trainer.default_local_dir)
        self.export_dir = Path(config.trainer.export_dir) if config.trainer.export_dir else self.run_dir / "hf"
        self.tokenizer = load_tokenizer(config.model)
        self.train_pairs, held_out = self.load_data()
        self.val_pairs = held_out[:config.data.val_batch_size]
        data = config.data
        for pairs in (self.train_pairs, self.val_pairs):
            check_pair_lengths(self.tokenizer, pairs, data.max_prompt_length, data.max_response_length,
                               data.apply_chat_template)
        self.checkpoints = CheckpointManager(self.run_dir, config.trainer.max_ckpt_to_keep)
        self._val_batch: Optional[Batch] = None

    def load_data(self) -> tuple[list[PreferencePair], list[PreferencePair]]:
        """``(train, held_out)`` pairs (:func:`load_pairs`)."""
        return load_pairs(self.config)

    def batch(self, step: int) -> Batch:
        """The pairs of optimizer step ``step`` (0-based), encoded."""
        return self.step_pairs(step)[1]

    def step_pairs(self, step: int) -> tuple[list[int], Batch]:
        """The indices (in ``train_pairs``) of optimizer step ``step``'s pairs, and the pairs encoded."""
        data = self.config.data
        picked = step_indices(len(self.train_pairs), data.train_batch_size, step, shuffle=data.shuffle, seed=data.seed)
        return picked, self.encode([self.train_pairs[index] for index in picked])

    def encode(self, pairs: list[PreferencePair]) -> Batch:
        data = self.config.data
        return encode_pairs(self.tokenizer, pairs, data.max_response_length, data.apply_chat_template)

    def validate(self, group: WorkerGroup) -> dict[str, float]:
        """Held-out accuracy, margin and loss (empty when there are no held-out pairs)."""
        if not self.val_pairs:
            return {}
        return validation_metrics(group.call(self.worker.compute_rewards, self.val_batch()))

    def val_batch(self) -> Batch:
        """The held-out pairs, encoded (once)."""
        if self._val_batch is None:
            self._val_batch = self.encode(self.val_pairs)
        return self._val_batch

    def fit(self) -> RMResult:
        config, trainer = self.config, self.config.trainer
        result = RMResult(self.run_dir, self.export_dir)
        pool = PoolSpec(self.role, nnodes=trainer.nnodes, devices_per_node=trainer.n_gpus_per_node,
                        device=resolved_device(config))
        with run_directory_lock(self.run_dir), \
                cluster(trainer.ray, [pool], {self.role: self.role}) as pools, \
                WorkerGroup(self.worker, pools.pool_for(self.role), name=f"{self.role}_train",
                            args=(config,)) as group:
            dump_config(config, self.run_dir)
            start = self._resume(group)
            self._before_steps(group, start)
            tracker = open_tracker(trainer, self.run_dir, total_steps=trainer.total_training_steps,
                                   start_step=start, monitoring=MonitoringConfig())
            try:
                self._loop(group, tracker, result, start)
                group.call(self.worker.export_hf, str(self.export_dir))
            finally:
                tracker.close()
        return result

    def _loop(self, group: WorkerGroup, tracker: Tracker, result: RMResult, start: int) -> None:
        trainer = self.config.trainer
        result.global_step = start
        if start == 0 and trainer.val_before_train:
            self._log_validation(group, tracker, result, 0)
        for step in range(start + 1, trainer.total_training_steps + 1):
            metrics = {f"{self.prefix}/{name}": value
                       for name, value in group.call(self.worker.update, self.batch(step - 1))[0].items()}
            result.global_step = step
            last = step == trainer.total_training_steps
            if last or (trainer.test_freq > 0 and step % trainer.test_freq == 0):
                metrics.update(self._log_validation(group, None, result, step))
            tracker.log(metrics, step=step)
            result.history.append(metrics)
            if trainer.save_freq > 0 and (step % trainer.save_freq == 0 or last):
                self._save(group, step)

    def _before_steps(self, group: WorkerGroup, start: int) -> None:
        """What the workers need before the steps after ``start`` (and validation): nothing for a reward model."""

    def _log_validation(self, group: WorkerGroup, tracker: Optional[Tracker], result: RMResult,
                        step: int) -> dict[str, float]:
        metrics = self.validate(group)
        if metrics:
            result.validations.append((step, metrics))
            if tracker is not None:
                tracker.log(metrics, step=step)
        return metrics

    def _save(self, group: WorkerGroup, step: int) -> Path:
        directory = self.checkpoints.partial_dir(step)
        group.call(self.worker.save_checkpoint, str(directory / self.role))
        return self.checkpoints.commit(step, {"global_step": step, "model_path": self.config.model.path})

    def _resume(self, group: WorkerGroup) -> int:
        """The step to continue after (0 for a fresh run), having loaded the latest checkpoint if configured."""
        checkpoint, state = resume_point(self.checkpoints, self.config.trainer.resume_mode,
                                         model_path=self.config.model.path)
        if checkpoint is None:
            return 0
        group.call(self.worker.load_checkpoint, str(checkpoint / self.role))
        logger.info("resumed %s training from %s at step %d", self.prefix, checkpoint, state["global_step"])
        return int(state["global_step"])

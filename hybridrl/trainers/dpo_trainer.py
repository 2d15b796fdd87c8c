"""Offline preference optimisation (``hybridrl dpo``): DPO, cDPO, IPO, SimPO or ORPO on preference pairs, on the FSDP2
worker stack — the reward-model trainer's loop (``rm_trainer.py``) with a policy instead of a scorer.

The loop, on the controller::

    reference log-probs of every training and held-out pair, once (loss.reference_log_probs=precompute; the
        reference is then freed), or of each step's pairs before its update (on_the_fly)
    for step in steps:
        pairs = the step's train_batch_size pairs (a pure function of the step: reshuffled per epoch, seeded)
        metrics = policy.update(pairs)      # split over DP ranks → micro-batches → one optimizer step
        every test_freq steps: held-out pairs → val/accuracy, val/margin, val/loss (the same loss, no gradient)
        every save_freq steps: checkpoint (resumable)
    export the policy as a Hugging Face directory
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from hybridrl.config.dpo_schema import REFERENCE_FREE_LOSSES, DPOConfig
from hybridrl.data.preference import PairFields
from hybridrl.engines.preference_losses import PairLogProbs, preference_loss, response_lengths
from hybridrl.protocol import Batch
from hybridrl.runtime import WorkerGroup
from hybridrl.trainers.rm_trainer import RMTrainer, step_indices
from hybridrl.workers.dpo_worker import DPOTrainWorker

logger = logging.getLogger(__name__)

REFERENCE_FIELDS = (PairFields.REFERENCE_CHOSEN_LOG_PROBS, PairFields.REFERENCE_REJECTED_LOG_PROBS)


class DPOTrainer(RMTrainer):
    """Trains a policy on preference pairs and exports it as a Hugging Face directory."""

    worker = DPOTrainWorker
    role, prefix = "actor", "dpo"  # checkpoints under actor/: `hybridrl export` and `eval` read a policy there

    def __init__(self, config: DPOConfig) -> None:
        super().__init__(config)
        self._reference: dict[str, Optional[torch.Tensor]] = {"train": None, "val": None}
        """Precomputed reference log-probs ``[pairs, 2]`` (chosen, rejected) of the training / held-out pairs."""
        self._group: Optional[WorkerGroup] = None

    @property
    def reads_reference(self) -> bool:
        return self.config.loss.type not in REFERENCE_FREE_LOSSES

    def batch(self, step: int) -> Batch:
        """The pairs of optimizer step ``step`` (0-based), encoded, with their reference log-probs."""
        picked, pairs = self.step_pairs(step)
        if self.config.loss.type == "orpo":  # the step is one optimizer step: its chosen tokens normalise the NLL
            chosen_tokens = response_lengths(pairs, self.config.data.max_response_length)[0].sum()
            pairs[PairFields.STEP_CHOSEN_TOKENS] = chosen_tokens.expand(len(pairs)).clone()
        precomputed = self._reference["train"]
        return self._with_reference(pairs, None if precomputed is None else precomputed[picked])

    def validate(self, group: WorkerGroup) -> dict[str, float]:
        """Held-out ``val/loss``, ``val/accuracy`` (pairs whose implicit reward ranks chosen first), ``val/margin``
        and the mean implicit rewards (empty when there are no held-out pairs)."""
        if not self.val_pairs:
            return {}
        pairs = self._with_reference(self.val_batch(), self._reference["val"])
        scored = group.call(DPOTrainWorker.policy_log_probs, pairs)
        lengths = response_lengths(pairs, self.config.data.max_response_length)
        policy = PairLogProbs(scored[PairFields.CHOSEN_LOG_PROBS], scored[PairFields.REJECTED_LOG_PROBS], *lengths)
        loss, metrics = preference_loss(self.config.loss, policy, pairs, len(pairs))
        return {"val/loss": float(loss), **{f"val/{name}": float(value) for name, value in metrics.items()}}

    def _before_steps(self, group: WorkerGroup, start: int) -> None:
        """``precompute``: the reference scores, in chunks, the training pairs the steps after ``start`` will draw
        (not the whole set when the run ends within its first epoch) and every held-out pair; then it is freed."""
        self._group = group
        if not self.reads_reference or self.config.loss.reference_log_probs != "precompute":
            return
        data = self.config.data
        drawn = sorted({index for step in range(start, self.config.trainer.total_training_steps)
                        for index in step_indices(len(self.train_pairs), data.train_batch_size, step,
                                                  shuffle=data.shuffle, seed=data.seed)})
        self._reference["train"] = self._scored(group, "train", self.train_pairs, drawn)
        self._reference["val"] = self._scored(group, "val", self.val_pairs, list(range(len(self.val_pairs))))
        group.call(DPOTrainWorker.release_reference)

    def _scored(self, group: WorkerGroup, split: str, pairs: list, indices: list[int]) -> torch.Tensor:
        """``[len(pairs), 2]`` reference log-probs (chosen, rejected) of ``pairs[indices]``; NaN for the others."""
        data = self.config.data
        chunk = max(data.val_batch_size, data.train_batch_size)
        table = torch.full((len(pairs), 2), float("nan"))
        for start in range(0, len(indices), chunk):
            part = indices[start:start + chunk]
            scored = group.call(DPOTrainWorker.reference_log_probs, self.encode([pairs[index] for index in part]))
            table[part] = torch.stack([scored[name] for name in REFERENCE_FIELDS], dim=-1)
            logger.info("reference log-probs: %s pairs %d/%d", split, min(start + chunk, len(indices)), len(indices))
        return table

    def _with_reference(self, pairs: Batch, precomputed: Optional[torch.Tensor]) -> Batch:
        """``pairs`` with their reference log-probs: ``precomputed`` ``[B, 2]``, or scored now (``on_the_fly``)."""
        if not self.reads_reference:
            return pairs
        if precomputed is None:
            assert self._group is not None, "the workers start before any batch is scored"
            return pairs.union(self._group.call(DPOTrainWorker.reference_log_probs, pairs))
        if bool(precomputed.isnan().any()):
            raise RuntimeError("a pair the reference did not score before training was drawn (precompute scores the "
                               "pairs of the configured steps)")
        for column, name in enumerate(REFERENCE_FIELDS):
            pairs[name] = precomputed[:, column].contiguous()
        return pairs

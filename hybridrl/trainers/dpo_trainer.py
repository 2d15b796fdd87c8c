"""Offline preference optimisation (``hybridrl dpo``): DPO, cDPO, IPO, SimPO or ORPO on preference pairs, KTO on
labelled completions (``hybridrl.data.unpaired``), on the FSDP2 worker stack — the reward-model trainer's loop
(``rm_trainer.py``) with a policy instead of a scorer.

The loop, on the controller::

    reference log-probs of every training and held-out pair, once (loss.reference_log_probs=precompute; the
        reference is then freed), or of each step's pairs before its update (on_the_fly)
    for step in steps:
        pairs = the step's train_batch_size pairs (a pure function of the step: reshuffled per epoch, seeded)
        KTO: z₀ = the step's KL estimate, mean(policy − reference log-probs of its rows' KL sides) ≥ 0, detached
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
from hybridrl.data.preference import PairFields, PreferencePair
from hybridrl.data.unpaired import (KTOPair, check_both_labels, kto_pairs, label_counts, read_labelled_completions,
                                    unpaired)
from hybridrl.engines.preference_losses import PairLogProbs, preference_loss, response_lengths
from hybridrl.protocol import Batch
from hybridrl.runtime import WorkerGroup
from hybridrl.trainers.rm_trainer import RMTrainer, load_pairs, step_indices
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

    @property
    def kto(self) -> bool:
        return self.config.loss.type == "kto"

    def load_data(self) -> tuple[list[PreferencePair], list[PreferencePair]]:
        """Pairs; for KTO, labelled completions (a paired row gives two) as :class:`KTOPair` rows."""
        if not self.kto:
            return super().load_data()
        train, held_out = load_pairs(self.config, read_labelled_completions, unpaired)
        check_both_labels(train, "data.train_files")
        seed = self.config.data.seed
        if len({item.prompt_key() for item in held_out}) < 2:
            if held_out:
                logger.warning("KTO: the held-out rows hold one prompt only, so they have no mismatched completion "
                               "for the KL estimate: no validation")
            held_out = []
        return kto_pairs(train, "data.train_files", seed), kto_pairs(held_out, "the held-out rows", seed) \
            if held_out else []

    def encode(self, pairs: list[PreferencePair]) -> Batch:
        """The pair Batch; KTO rows add their labels (``desirable``) and the batch's label counts."""
        batch = super().encode(pairs)
        if self.kto:
            rows: list[KTOPair] = pairs  # type: ignore[assignment]  (load_data gives KTO rows only)
            batch[PairFields.DESIRABLE] = torch.tensor([float(row.desirable) for row in rows], dtype=torch.float32)
            counts = torch.tensor(label_counts(rows), dtype=torch.float32)
            batch[PairFields.STEP_LABEL_COUNTS] = counts.expand(len(rows), 2).clone()
        return batch

    def batch(self, step: int) -> Batch:
        """The pairs of optimizer step ``step`` (0-based), encoded, with their reference log-probs (KTO: and the
        step's reference point ``z₀``)."""
        picked, pairs = self.step_pairs(step)
        if self.config.loss.type == "orpo":  # the step is one optimizer step: its chosen tokens normalise the NLL
            chosen_tokens = response_lengths(pairs, self.config.data.max_response_length)[0].sum()
            pairs[PairFields.STEP_CHOSEN_TOKENS] = chosen_tokens.expand(len(pairs)).clone()
        precomputed = self._reference["train"]
        pairs = self._with_reference(pairs, None if precomputed is None else precomputed[picked])
        if self.kto:
            assert self._group is not None, "the workers start before any batch is drawn"
            policy_kl = self._group.call(DPOTrainWorker.policy_kl_log_probs, pairs)[PairFields.REJECTED_LOG_PROBS]
            pairs[PairFields.STEP_KL] = reference_point(policy_kl, pairs)
        return pairs

    def validate(self, group: WorkerGroup) -> dict[str, float]:
        """Held-out ``val/loss``, ``val/accuracy`` (pairs whose implicit reward ranks chosen first), ``val/margin``
        and the mean implicit rewards (empty when there are no held-out pairs)."""
        if not self.val_pairs:
            return {}
        pairs = self._with_reference(self.val_batch(), self._reference["val"])
        scored = group.call(DPOTrainWorker.policy_log_probs, pairs)
        lengths = response_lengths(pairs, self.config.data.max_response_length)
        policy = PairLogProbs(scored[PairFields.CHOSEN_LOG_PROBS], scored[PairFields.REJECTED_LOG_PROBS], *lengths)
        if self.kto:  # the held-out rows' own reference point, from their KL sides
            pairs[PairFields.STEP_KL] = reference_point(policy.rejected, pairs)
        loss, metrics = preference_loss(self.config.loss, policy, pairs, len(pairs))
        if self.kto:
            metrics["accuracy"] = ranking_accuracy(policy.chosen - pairs[PairFields.REFERENCE_CHOSEN_LOG_PROBS],
                                                   pairs[PairFields.DESIRABLE] > 0.5)
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


def reference_point(policy_kl: torch.Tensor, rows: Batch) -> torch.Tensor:
    """KTO's ``z₀`` for every row ``[B]``: the mean over ``rows`` of the policy's minus the reference's log-probs of
    their KL sides, at least 0 (as TRL's ``kl``), detached."""
    kl = (policy_kl.float() - rows[PairFields.REFERENCE_REJECTED_LOG_PROBS].float()).mean().clamp_min(0).detach()
    return kl.expand(len(rows)).clone()


def ranking_accuracy(rewards: torch.Tensor, desirable: torch.Tensor) -> torch.Tensor:
    """KTO's held-out accuracy: the share of (desirable, undesirable) row pairs whose desirable row has the higher
    implicit reward (the rewards' AUROC; ties count as wrong, so 0 while the policy is the reference)."""
    ranked = rewards[desirable][:, None] > rewards[~desirable][None, :]
    return ranked.float().mean() if ranked.numel() else torch.tensor(float("nan"))

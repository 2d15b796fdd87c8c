"""The reward-model worker: a sequence-scoring model (FSDP2) that gives each response one scalar score.

The model is ``AutoModelForSequenceClassification`` with one label. The score is read at each sequence's last real
token (from ``attention_mask``), not where the pad token first appears: a tokenizer whose pad token is its EOS token
would otherwise be scored at the wrong position.
"""

from __future__ import annotations

import torch

from hybridrl.config.plugins import load_plugins
from hybridrl.config.schema import TrainConfig
from hybridrl.runtime import Worker, dp_split
from hybridrl.protocol import Batch, Fields
from hybridrl.workers.building import sharding_options
from hybridrl.modeling.fsdp import shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.sequences import sequence_scores

RM_SCORES = "rm_scores"


class RewardModelWorker(Worker):
    """One rank of the reward model (``reward_model.model_path``), sharded like the actor, no optimizer.

    It scores the token ids it is given: the controller passes the policy's ids when the vocabularies agree and
    re-tokenised sequences otherwise (``hybridrl.trainers.reward_fusion``)."""

    def __init__(self, config: TrainConfig) -> None:
        load_plugins(config.trainer.plugins)  # the components a recipe registered, in this process too
        reward = config.reward_model
        if not reward.model_path:
            raise ValueError("reward_model.model_path is required for a reward-model worker")
        self.config = config
        self.model = build_model(config.model, "reward_model", path=reward.model_path,
                                 device_type=self.device.type).to(self.device)
        self.model.requires_grad_(False)
        self.model.eval()
        shard_model(self.model, self.dp_mesh, sharding_options(config.model.dtype, config.actor.fsdp,
                                                               param_offload=False, keep_gathered=False,
                                                               fsdp_size=-1))  # its own pool: all of its ranks

    @dp_split
    @torch.no_grad()
    def compute_rm_score(self, batch: Batch) -> Batch:
        """``rm_scores [B]``: the reward model's score of each prompt + response, in micro-batches."""
        size = self.config.reward_model.micro_batch_size_per_gpu
        scores = [sequence_scores(self.model, chunk[Fields.INPUT_IDS], chunk[Fields.ATTENTION_MASK])
                  for chunk in batch.split_every(size)]
        return Batch(tensors={RM_SCORES: torch.cat(scores)})

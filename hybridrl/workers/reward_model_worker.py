"""The reward-model worker: a sequence-scoring model (FSDP2) that gives each response one scalar score.

The model is ``AutoModelForSequenceClassification`` with one label. The score is read at each sequence's last real
token (from ``attention_mask``), not where the pad token first appears: a tokenizer whose pad token is its EOS token
would otherwise be scored at the wrong position.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridrl.config.schema import TrainConfig
from hybridrl.controller import Worker, dp_split
from hybridrl.protocol import Batch, Fields
from hybridrl.workers.actor_worker import sharding_options
from hybridrl.workers.fsdp import shard_model
from hybridrl.workers.model_builder import build_model
from hybridrl.workers.sequences import position_ids_from_mask

RM_SCORES = "rm_scores"


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                    packed: bool = False) -> torch.Tensor:
    """``[B]`` scores of a one-label sequence classifier at each row's last real token (rows left/right padded).

    The per-token head outputs are captured with a forward hook on ``model.score`` during the root forward (FSDP2
    only gathers the head's parameters inside that forward), then read at the last position of ``attention_mask``.
    ``packed``: the real tokens of all rows go through as one ``[1, N]`` row with per-sequence position ids (a
    block-diagonal causal mask: no attention across rows, no FLOPs on pads); the scores equal the padded forward's.
    Gradients flow through the scores when grad mode is on (reward-model training).
    """
    captured: list[torch.Tensor] = []
    handle = model.score.register_forward_hook(lambda module, inputs, output: captured.append(output))
    positions = position_ids_from_mask(attention_mask)
    real = attention_mask.bool()
    try:
        if packed:  # use_cache=False: transformers only detects packed sequences without a KV cache
            output = model(input_ids=input_ids[real][None], position_ids=positions[real][None], use_cache=False)
        else:
            output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                           use_cache=False)
    finally:
        handle.remove()
    per_token = captured[0].squeeze(-1).float()
    if packed:
        scores = per_token[0, real.sum(dim=-1).cumsum(dim=0) - 1]
    else:
        columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        scores = per_token[torch.arange(len(per_token)), (real * columns).argmax(dim=-1)]
    # FSDP2 unshards the root's parameters (embeddings, final norm, head) for backward in a hook on the root forward's
    # *outputs*; scores read from a hooked intermediate would bypass it. A zero-weighted term keeps the output in the
    # graph (exactly +0 to every score) so that hook fires.
    return scores + 0.0 * output.logits.float().sum()


class RewardModelWorker(Worker):
    """One rank of the reward model (``reward_model.model_path``), sharded like the actor, no optimizer.

    It scores the token ids it is given: the controller passes the policy's ids when the vocabularies agree and
    re-tokenised sequences otherwise (``hybridrl.controller.reward_fusion``)."""

    def __init__(self, config: TrainConfig) -> None:
        reward = config.reward_model
        if not reward.model_path:
            raise ValueError("reward_model.model_path is required for a reward-model worker")
        self.config = config
        self.model = build_model(config.model, "reward_model", path=reward.model_path,
                                 device_type=self.device.type).to(self.device)
        self.model.requires_grad_(False)
        self.model.eval()
        shard_model(self.model, self.dp_mesh, sharding_options(config, param_offload=False))

    @dp_split
    @torch.no_grad()
    def compute_rm_score(self, batch: Batch) -> Batch:
        """``rm_scores [B]``: the reward model's score of each prompt + response, in micro-batches."""
        size = self.config.reward_model.micro_batch_size_per_gpu
        scores = [sequence_scores(self.model, chunk[Fields.INPUT_IDS], chunk[Fields.ATTENTION_MASK])
                  for chunk in batch.split_every(size)]
        return Batch(tensors={RM_SCORES: torch.cat(scores)})

"""The HF engine records the experts an MoE model routed each token to while it generated (R3's record): every fed
token's routing lands at its column of the rollout layout — shared prompt prefill, decode steps on the rows still
running, chunks — and it is the routing a full forward of the same rows chooses (up to near-ties that the cached and
the full forward round differently)."""

from __future__ import annotations

import pytest
import torch

from hybridrl.modeling.positions import position_ids_from_mask
from hybridrl.modeling.routing_replay import recorded_routing, routers
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

VOCAB = 60
ENDINGS = [1, 5, 9, 13]  # rows end at spread-out steps, so ended rows leave the decode batch


def tiny_moe(architecture="qwen3_moe"):
    torch.manual_seed(0)
    return build_tiny_model(TinyModelSpec(architecture=architecture), VOCAB, pad_token_id=0, eos_token_id=1).float()


def prompts(rows=4, length=6) -> Batch:
    ids = torch.randint(14, VOCAB, (rows, length), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : row % 3] = 0
    return Batch(tensors={Fields.INPUT_IDS: ids.masked_fill(mask == 0, 0), Fields.ATTENTION_MASK: mask},
                 non_tensors={Fields.UID: [f"p{row}" for row in range(rows)]})


def full_forward_routing(model, rollout):
    ids, mask = rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK]
    with torch.no_grad(), recorded_routing(model) as record:
        model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    return torch.stack([calls[0].view(*ids.shape, -1) for calls in record], dim=2)


@pytest.mark.parametrize("architecture", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("n,micro_batch_size", [(3, None), (1, None), (2, 4)], ids=["shared_prefill", "n1", "chunks"])
def test_the_record_is_the_generations_routing_at_every_fed_token(architecture, n, micro_batch_size):
    model = tiny_moe(architecture)
    engine = HFRollout(model, pad_token_id=0, eos_token_ids=ENDINGS, micro_batch_size=micro_batch_size,
                       record_routing=True)
    rollout = engine.generate(prompts(), SamplingParams(n=n, max_new_tokens=10, seed=3))
    experts = rollout[Fields.ROUTED_EXPERTS]
    mask = rollout[Fields.ATTENTION_MASK].bool()
    top_k = routers(model)[0].top_k
    assert experts.dtype == torch.int16 and experts.shape == (*mask.shape, len(routers(model)), top_k)
    # recorded: every real token but each row's last, which was sampled and fed back only if the row ran one step
    # more (it ended and had not left the batch yet, or another chunk row was still running); never padding
    last = mask.shape[1] - 1 - mask.flip(1).long().argmax(1)
    fed = mask.clone()
    fed[torch.arange(len(fed)), last] = False
    recorded = (experts >= 0).all(-1).all(-1)
    assert bool(recorded[fed].all()) and not bool(recorded[~mask].any())
    assert bool(((experts >= 0).all(-1) == (experts >= 0).any(-1)).all())  # a token is recorded at all routers or none
    assert engine.decode_rows_run < len(rollout) * 10  # rows left the batch as they ended
    full = full_forward_routing(model, rollout)
    same = (experts[fed].long().sort(-1).values == full[fed].sort(-1).values).all(-1)
    assert same.float().mean() > 0.97, same.float().mean()


def test_a_dense_model_cannot_record_routing():
    dense = build_tiny_model(TinyModelSpec(), VOCAB, pad_token_id=0, eos_token_id=1)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        HFRollout(dense, pad_token_id=0, eos_token_ids=ENDINGS, record_routing=True)

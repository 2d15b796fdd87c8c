"""The HF engine drops rows that have ended from its decode batch: the same tokens as a loop that keeps every row
(fast step and module forward, fp32 and bf16 casts, sampling filters, chunks), on fewer rows. In bf16 the log-probs
are the same bits too; in fp32 a product of fewer rows can round differently in the last bit (MKL picks its kernel by
the row count: 4.8e-7 here), so they agree to fp32 rounding."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from hybridrl.modeling.attention import attention_implementation
from hybridrl.modeling.single_rank import apply_compute_dtype
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.rollout.hf_decode import _rows_to_keep

VOCAB = 48
ENDINGS = [1, 5, 9, 13]  # four EOS ids out of 48: rows end at spread-out steps


def tiny_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                         eos_token_id=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation=attention_implementation("auto", "cpu")).eval()
    return model if dtype == torch.float32 else apply_compute_dtype(model, dtype)


def prompts(rows: int = 6, length: int = 7) -> Batch:
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(14, VOCAB, (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : row % 3] = 0
    return Batch(tensors={Fields.INPUT_IDS: ids.masked_fill(mask == 0, 0), Fields.ATTENTION_MASK: mask},
                 non_tensors={Fields.UID: [f"p{row}" for row in range(rows)]})


def rollouts(model, *, drop: bool, fast: bool, params: SamplingParams, micro_batch_size=None):
    engine = HFRollout(model, pad_token_id=0, eos_token_ids=ENDINGS, fast_decode=fast, drop_ended_rows=drop,
                       micro_batch_size=micro_batch_size)
    return engine.generate(prompts(), params), engine


SAMPLING = {
    "temperature": dict(temperature=0.9),
    "top_k_top_p": dict(temperature=1.1, top_k=12, top_p=0.9),
    "greedy": dict(do_sample=False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fast", [True, False], ids=["fast_step", "module_forward"])
@pytest.mark.parametrize("sampling", sorted(SAMPLING))
def test_dropping_ended_rows_samples_what_keeping_them_samples(sampling, fast, dtype):
    model = tiny_model(dtype)
    params = SamplingParams(n=4, max_new_tokens=16, seed=7, **SAMPLING[sampling])
    dropped, dropping = rollouts(model, drop=True, fast=fast, params=params)
    kept, keeping = rollouts(model, drop=False, fast=fast, params=params)
    lengths = kept[Fields.RESPONSE_MASK].sum(1)
    if sampling != "greedy":  # the case is only a test if rows end at different steps, some before the last
        assert lengths.min() < 8 and lengths.max() == 16, lengths
    assert torch.equal(dropped[Fields.RESPONSES], kept[Fields.RESPONSES])
    if dtype == torch.bfloat16:
        assert torch.equal(dropped[Fields.ROLLOUT_LOG_PROBS], kept[Fields.ROLLOUT_LOG_PROBS])
    else:
        torch.testing.assert_close(dropped[Fields.ROLLOUT_LOG_PROBS], kept[Fields.ROLLOUT_LOG_PROBS], atol=2e-6, rtol=0)
    assert torch.equal(dropped[Fields.RESPONSE_MASK], kept[Fields.RESPONSE_MASK])
    assert dropping.decode_path == keeping.decode_path == ("fast" if fast else "module")
    steps = kept[Fields.RESPONSES].shape[1]
    assert keeping.decode_rows_run == 24 * steps
    if sampling != "greedy":
        assert dropping.decode_rows_run < keeping.decode_rows_run


def test_chunks_drop_their_own_rows():
    model = tiny_model(torch.bfloat16)
    params = SamplingParams(n=4, max_new_tokens=16, temperature=1.0, seed=3)
    dropped, dropping = rollouts(model, drop=True, fast=True, params=params, micro_batch_size=8)
    kept, keeping = rollouts(model, drop=False, fast=True, params=params, micro_batch_size=8)
    assert torch.equal(dropped[Fields.RESPONSES], kept[Fields.RESPONSES])
    assert torch.equal(dropped[Fields.ROLLOUT_LOG_PROBS], kept[Fields.ROLLOUT_LOG_PROBS])
    assert dropping.decode_rows_run < keeping.decode_rows_run


def test_when_rows_are_dropped():
    ended = torch.zeros(32, dtype=torch.bool)
    assert _rows_to_keep(ended, []) is None                       # none ended
    ended[[3, 9, 20]] = True
    assert _rows_to_keep(ended, []) is None                       # fewer than an eighth: not worth a cache copy
    ended[30] = True
    keep = _rows_to_keep(ended, [])
    assert keep.tolist() == [row for row in range(32) if row not in (3, 9, 20, 30)]
    assert _rows_to_keep(torch.ones(32, dtype=torch.bool), []) is None   # all ended: a rank waiting for others
    assert _rows_to_keep(ended, object()) is None                 # a cache that cannot select rows

"""The LM head runs as one matmul over the positions it scores, never against a per-row copy of its weight.

transformers applies an int ``logits_to_keep`` as the slice ``hidden[:, -k:, :]``; for rows longer than ``k`` that
slice is not contiguous, ``F.linear`` cannot fold it into one matmul, and it multiplies the rows against the weight
expanded to ``[rows, D, V]`` — a copy of the whole head per row (574 ms instead of 8 ms for 8 rows at SmolLM2's
size). ``F.linear`` folds the slice anyway when the weight requires grad, so a plain model hides the problem; it
shows where the weight is a compute-dtype cast (one-rank bf16, ``hybridrl.modeling.single_rank``) and grad is off:
the generation prefill and the old / reference log-prob passes. These tests profile those calls on a tiny model and
fail if any batched matmul sees the head's weight."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile
from transformers import AutoModelForCausalLM

from hybridrl.config.schema import ModelConfig
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.modeling.single_rank import apply_compute_dtype, casts_kept
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_model import save_tiny_model


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("head_positions") / "model")


@pytest.fixture(scope="module")
def model(directory):
    """fp32 master weights computing in bf16 on one rank, as the actor on a CPU runs."""
    return apply_compute_dtype(build_model(ModelConfig(path=str(directory), dtype="float32"), "actor"), torch.bfloat16)


def head_weight_copies(model, run) -> list[str]:
    """The batched matmuls (and expansions) of ``run()`` that took the LM head's ``[V, D]`` weight per row."""
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    per_row_weight = ([hidden, vocab], [vocab, hidden])
    with profile(record_shapes=True) as profiler:
        run()
    return [f"{event.name} {event.input_shapes}" for event in profiler.events()
            if event.name in ("aten::bmm", "aten::expand")
            and any(len(shape) == 3 and shape[1:] in per_row_weight for shape in event.input_shapes)]


def rows(length: int, count: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    input_ids = torch.randint(5, 30, (count, length), generator=torch.Generator().manual_seed(length))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0  # left padding
    return input_ids, attention_mask


def test_padded_log_probs_run_the_head_as_one_matmul(model):
    input_ids, attention_mask = rows(12)

    def old_log_probs():
        with torch.no_grad(), casts_kept(model):
            response_log_probs(model, input_ids, attention_mask, 5, packed=False)
    assert head_weight_copies(model, old_log_probs) == []


def test_its_scores_are_the_full_forwards(directory):
    plain = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    input_ids, attention_mask = rows(12)
    with torch.no_grad():
        kept, _ = response_log_probs(plain, input_ids, attention_mask, 5, packed=False)
        logits = plain(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=(attention_mask.cumsum(-1) - 1).clamp_min(0)).logits[:, -6:-1].float()
    full = logits.log_softmax(-1).gather(-1, input_ids[:, -5:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(kept, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 3])
def test_generation_prefill_and_decode_run_the_head_as_one_matmul(model, n):
    """``n == 1``: the first forward runs whole prompts; ``n > 1``: the shared prefill runs them once."""
    input_ids, attention_mask = rows(10)
    prompts = Batch(tensors={Fields.INPUT_IDS: input_ids, Fields.ATTENTION_MASK: attention_mask},
                    non_tensors={Fields.UID: [str(i) for i in range(4)]})
    engine = HFRollout(model, pad_token_id=0, eos_token_ids=[1])
    copies = head_weight_copies(model, lambda: engine.generate(prompts, SamplingParams(n=n, max_new_tokens=3, seed=0)))
    assert copies == []

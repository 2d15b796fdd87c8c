"""The HF engine on a tiny real model: greedy parity with transformers, the rollout layout, and the log-prob gate."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_model import encode_chat, save_tiny_model
from hybridrl.modeling.sequences import response_log_probs

PROMPTS = ["12+34=", "7*8=", "100-1=", "9+9="]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    directory = save_tiny_model(tmp_path_factory.mktemp("hf_rollout") / "model")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, PROMPTS)}, return_tensors="pt")
    prompts = Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                    non_tensors={Fields.UID: [f"p{i}" for i in range(len(PROMPTS))]})
    engine = HFRollout(model, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id])
    return model, tokenizer, encoded, prompts, engine


def test_greedy_matches_plain_generate(setup):
    model, tokenizer, encoded, prompts, engine = setup
    output = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=8, do_sample=False))
    reference = model.generate(**encoded, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id)[:, encoded["input_ids"].shape[1]:]
    width = reference.shape[1]
    mask = output[Fields.RESPONSE_MASK][:, :width].bool()
    assert torch.equal(output[Fields.RESPONSES][:, :width][mask], reference[mask])
    assert output[Fields.RESPONSES].shape == (4, 8)


def test_shared_prefill_gives_plain_generate_responses(setup):
    """n > 1: each prompt is prefilled once and its cache repeated; greedy responses (and their log-probs) are those
    of transformers' own ``generate`` on the repeated prompts."""
    model, tokenizer, encoded, prompts, engine = setup
    output = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, do_sample=False))
    repeated = {name: tensor.repeat_interleave(2, 0) for name, tensor in encoded.items()}
    reference = model.generate(**repeated, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id, output_logits=True, return_dict_in_generate=True)
    sequences = reference.sequences[:, encoded["input_ids"].shape[1]:]
    width = sequences.shape[1]
    mask = output[Fields.RESPONSE_MASK][:, :width].bool()
    assert torch.equal(output[Fields.RESPONSES][:, :width][mask], sequences[mask])
    log_probs = torch.stack(reference.logits, 1).log_softmax(-1).gather(-1, sequences.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(output[Fields.ROLLOUT_LOG_PROBS][:, :width][mask], log_probs[mask], atol=1e-5, rtol=0)


def test_sampled_layout_and_log_prob_gate(setup):
    model, _, _, prompts, engine = setup
    params = SamplingParams(n=3, max_new_tokens=6, temperature=0.7, seed=11)
    output = engine.generate(prompts, params)
    assert len(output) == 12 and list(output[Fields.UID][:3]) == ["p0"] * 3
    assert torch.equal(output[Fields.INPUT_IDS][:, -6:], output[Fields.RESPONSES])
    with torch.no_grad():
        trainer_log_probs, _ = response_log_probs(model, output[Fields.INPUT_IDS], output[Fields.ATTENTION_MASK], 6,
                                                  temperature=0.7)
    mask = output[Fields.RESPONSE_MASK].bool()
    assert float((trainer_log_probs - output[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max()) < 1e-5
    again = engine.generate(prompts, params)
    assert torch.equal(again[Fields.RESPONSES], output[Fields.RESPONSES])  # seeded sampling is reproducible


def test_response_mask_ends_after_the_first_eos():
    from hybridrl.protocol.rollout_layout import response_mask_from_eos

    responses = torch.tensor([[5, 6, 1, 7, 1], [5, 5, 5, 5, 5], [1, 9, 9, 9, 9]])
    assert response_mask_from_eos(responses, [1]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]

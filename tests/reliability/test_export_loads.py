"""``hybridrl export`` of a real run's checkpoint (FSDP2 shards of 2 ranks) equals the workers' own export
(``trainer.export_at_end``) tensor for tensor, loads in plain transformers with identical logits, and loads in vLLM
(CPU build), whose greedy tokens equal transformers' ``generate``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from reliability_helpers import checkpoint_weights
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hybridrl.cli import main

# test-long (CI runs it), beside the other users of the fault-free reference run: that run alone took 137 s of the
# parallel suite, whose 15 minutes it outgrew on a slower VM (2026-12-06).
pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long]


@pytest.fixture(scope="module")
def exported(straight_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    assert main(["export", str(straight_run), str(out)]) == 0
    return out


def test_cli_export_equals_the_workers_export_and_the_checkpoint(straight_run, exported):
    from_cli, from_workers = load_file(exported / "model.safetensors"), load_file(straight_run / "hf" / "model.safetensors")
    assert from_cli.keys() == from_workers.keys()
    checkpoint = checkpoint_weights(straight_run / "checkpoints" / "global_step_3")
    for name, tensor in from_cli.items():
        assert torch.equal(tensor, from_workers[name]) and torch.equal(tensor, checkpoint[name]), name
    ids = torch.tensor([[2, 10, 11, 20, 3]])
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(input_ids=ids).logits
                  for path in (exported, straight_run / "hf")]
    assert torch.equal(*logits)


VLLM_CHECK = textwrap.dedent("""
    import sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from hybridrl.config.schema import RolloutConfig
    from hybridrl.protocol import Batch, Fields
    from hybridrl.rollout import EngineInputs, build_rollout_engine
    from hybridrl.rollout.base import SamplingParams
    from hybridrl.utils.tiny_model import encode_chat

    path, new_tokens = sys.argv[1], 8
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = encode_chat(tokenizer, ["3+4=", "what is 7*8?"])
    engine = build_rollout_engine("vllm", EngineInputs(
        rollout=RolloutConfig(name="vllm", kv_cache_memory_mb=64, max_num_seqs=8, max_num_batched_tokens=512),
        pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], model_path=path,
        max_model_len=128, dtype="float32"))
    padded = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    batch = Batch(tensors={Fields.INPUT_IDS: padded["input_ids"], Fields.ATTENTION_MASK: padded["attention_mask"]},
                  non_tensors={Fields.UID: ["a", "b"]})
    vllm_tokens = engine.generate(batch, SamplingParams(max_new_tokens=new_tokens, do_sample=False))[Fields.RESPONSES]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for row, ids in enumerate(prompts):
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)[0, len(ids):]
        assert vllm_tokens[row, :len(out)].tolist() == out.tolist(), (row, vllm_tokens[row].tolist(), out.tolist())
    print("vllm greedy == transformers greedy", vllm_tokens.tolist())
""")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install 'hybridrl[cpu]')")
def test_export_loads_in_vllm(exported):
    # A child process: in-process vLLM changes process-wide settings (threads, LD_PRELOAD) for the rest of the session.
    child = subprocess.run([sys.executable, "-c", VLLM_CHECK, str(exported)], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-4000:]
    assert "vllm greedy == transformers greedy" in child.stdout

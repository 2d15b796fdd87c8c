"""What an engine receives is the checkpoint's own tensors, for every architecture: transformers' in-memory forms
(fused experts, renamed routers) are reverted, a tied output head is sent under its own name, and the split plan uses
tensor-parallel slices only where they are vetted."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hybridrl.hybrid_engine.checkpoint_names import CheckpointNames, engine_rule
from hybridrl.hybrid_engine.tp_rules import REPLICATED
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("architectures")
    specs = {"llama": TinyModelSpec(), "llama_tied": TinyModelSpec(tie_word_embeddings=True),
             "mixtral": TinyModelSpec(architecture="mixtral"), "qwen3_moe": TinyModelSpec(architecture="qwen3_moe"),
             "phi3": TinyModelSpec(architecture="phi3")}
    return {name: save_tiny_model(root / name, spec) for name, spec in specs.items()}


@pytest.mark.parametrize("name", ["llama", "llama_tied", "mixtral", "qwen3_moe", "phi3"])
def test_streamed_parameters_become_the_checkpoints_tensors(saved, name):
    """The slow reference is ``save_pretrained``'s own file: names and values equal, tensor for tensor."""
    model = AutoModelForCausalLM.from_pretrained(saved[name], dtype=torch.float32)
    names = CheckpointNames.from_pretrained(str(saved[name]))
    sent = dict(names.to_checkpoint((key, param.detach()) for key, param in model.named_parameters()))
    on_disk = load_file(saved[name] / "model.safetensors")
    tied = set(names.tied_output.values())
    assert set(sent) == set(on_disk) | tied
    for key, tensor in on_disk.items():
        assert torch.equal(sent[key], tensor), key
    for key in tied:  # the tied head is the embedding's tensor, under the head's name
        assert torch.equal(sent[key], sent[next(iter(names.tied_output))])


def test_what_converts_and_what_is_tied_is_named(saved):
    mixtral = CheckpointNames.from_pretrained(str(saved["mixtral"]))
    assert mixtral.converted and all(".mlp." in name for name in mixtral.converted)
    assert f"{len(mixtral.converted)} parameter(s) held in another form" in mixtral.describe()
    llama = CheckpointNames.from_pretrained(str(saved["llama"]))
    assert not llama.converted and not llama.tied_output
    tied = CheckpointNames.from_pretrained(str(saved["llama_tied"]))
    assert tied.tied_output == {"model.embed_tokens.weight": "lm_head.weight"}


def test_tensor_parallel_slices_only_where_vetted(saved):
    """Llama: the slice table (q_proj by heads); Phi-3's fused qkv_proj and Mixtral's converted experts: whole."""
    llama = AutoModelForCausalLM.from_pretrained(saved["llama"])
    assert engine_rule(llama, 2)("model.layers.0.self_attn.q_proj.weight", (64, 64)).kind == "column"
    for name in ("phi3", "mixtral"):
        model = AutoModelForCausalLM.from_pretrained(saved[name])
        rule = engine_rule(model, 2)
        assert all(rule(key, tuple(param.shape)) == REPLICATED for key, param in model.named_parameters()), name

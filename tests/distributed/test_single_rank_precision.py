"""One rank with ``gather_once``: bf16 mixed precision without FSDP2 (``hybridrl.modeling.single_rank``) gives the
same numbers, bit for bit, as the same model under FSDP2 on one rank — two optimizer steps of three micro-batches,
log-probs, sampled generation — with tied embeddings, with activation checkpointing and with LoRA adapters; the module keeps its fp32
parameters outside forward (also after a failed forward) and returns fp32 outputs."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

from hybridrl.config.schema import LoraConfig, ModelConfig, OptimConfig
from hybridrl.protocol import Batch
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.distributed import full_tensor
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.engines.passes import log_probs as policy_log_probs
from hybridrl.modeling.fsdp import ShardingOptions, parameters_kept_gathered, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.modeling.single_rank import _STATE_ATTRIBUTE, _cast_floats, apply_compute_dtype, has_compute_casts

pytestmark = pytest.mark.distributed
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.01)
LOSS = PolicyLoss(forward=SequenceForward(), temperature=1.0, loss_scale_factor=6.0)


def make_batch(seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(6, 12, dtype=torch.long)
    mask[0, :2] = 0
    mask[4, -3:] = 0
    ids = torch.randint(4, 60, (6, 12), generator=generator) * mask
    return Batch(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, -6:].clone(),
                          "response_mask": mask[:, -6:].clone(), "old_log_probs": -torch.rand(6, 6, generator=generator),
                          "advantages": torch.randn(6, 6, generator=generator)})


def run_layout(model_dir, keep_gathered: bool, checkpointing: bool, lora: bool) -> dict:
    """Two optimizer steps (3 micro-batches each, parameters gathered once per step), then log-probs and a sampled
    generation, on one rank; ``keep_gathered`` picks the path without FSDP2."""
    torch.manual_seed(0)
    adapters = LoraConfig(rank=4, alpha=8) if lora else LoraConfig()
    model = build_model(ModelConfig(path=str(model_dir), dtype="bfloat16", lora=adapters), "actor")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    shard_model(model, init_device_mesh("cpu", (1,)),
                ShardingOptions(compute_dtype=torch.bfloat16, keep_gathered=keep_gathered))
    optimizer = build_optimizer(model, OPTIM)
    micro_batching = MicroBatching(micro_batch_size=2, gather_once=True)
    engine = TrainingEngine(model, dp=DataParallelGroup(), micro_batching=micro_batching, optimizer=optimizer,
                            scheduler=build_scheduler(optimizer, OPTIM, total_steps=10), grad_clip=1e9)
    norms = []
    for step in range(2):
        metrics = engine.optimizer_step(make_batch(step), LOSS)
        norms.append(metrics["grad_norm"])
    log_probs = policy_log_probs(engine, make_batch(5), micro_batching, SequenceForward(), temperature=1.0,
                                 with_entropy=False)["old_log_probs"]
    prompts = make_batch(6).select("input_ids", "attention_mask")
    rollout = HFRollout(model, pad_token_id=0, eos_token_ids=[1]).generate(
        prompts, SamplingParams(n=2, max_new_tokens=5, temperature=1.0, seed=3))
    return dict(params={name: full_tensor(param.detach()).clone() for name, param in model.named_parameters()},
                norms=norms, log_probs=log_probs, responses=rollout["responses"],
                rollout_log_probs=rollout["rollout_log_probs"], fsdp=isinstance(model, FSDPModule),
                plain=has_compute_casts(model))


def compare_layouts(rank, world, model_dir, checkpointing, lora, out_path):
    torch.save({keep: run_layout(model_dir, keep, checkpointing, lora) for keep in (False, True)}, out_path)


@pytest.mark.parametrize("tied,checkpointing,lora", [(False, False, False), (True, False, False),
                                                     (False, True, False), (False, False, True)],
                         ids=["untied", "tied", "checkpointing", "lora"])
def test_same_bits_as_fsdp2_on_one_rank(tmp_path, tied, checkpointing, lora):
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(tie_word_embeddings=tied))
    run_on_gloo(1, compare_layouts, model_dir, checkpointing, lora, tmp_path / "out.pt")
    results = torch.load(tmp_path / "out.pt", weights_only=False)
    fsdp2, plain = results[False], results[True]
    assert fsdp2["fsdp"] and not fsdp2["plain"] and plain["plain"] and not plain["fsdp"]
    if lora:  # it trained: the adapters' B matrices start at zero
        assert any(value.abs().sum() > 0 for name, value in plain["params"].items() if "lora_B" in name)
    else:
        initial = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor").state_dict()
        assert any(not torch.equal(plain["params"][name], initial[name]) for name in plain["params"])
    for name, value in fsdp2["params"].items():
        assert value.dtype == plain["params"][name].dtype == torch.float32, name  # fp32 master weights
        assert torch.equal(value, plain["params"][name]), name
    assert plain["norms"] == pytest.approx(fsdp2["norms"], rel=1e-6)
    for key in ("log_probs", "responses", "rollout_log_probs"):
        assert torch.equal(fsdp2[key], plain[key]), key


def test_fp32_parameters_outside_forward_and_fp32_outputs(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec())
    model = apply_compute_dtype(build_model(ModelConfig(path=str(model_dir), dtype="bfloat16"), "actor"),
                                torch.bfloat16)  # as shard_model does on one rank; no process group needed
    ids = torch.randint(4, 60, (2, 7))
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    output = model(input_ids=ids)
    assert seen == [torch.bfloat16] and output.logits.dtype == torch.float32
    assert all(param.dtype == torch.float32 and isinstance(param, torch.nn.Parameter) for param in model.parameters())
    with pytest.raises(IndexError):
        model(input_ids=torch.full((1, 3), 10_000))  # out of the vocabulary: forward fails midway
    assert all(isinstance(param, torch.nn.Parameter) for param in model.parameters())  # swapped back all the same
    output.logits.sum().backward()
    assert all(param.grad is not None and param.grad.dtype == torch.float32 for param in model.parameters())
    weights = []
    model.get_input_embeddings().register_forward_pre_hook(lambda module, args: weights.append(module.weight))
    with parameters_kept_gathered(model):  # one cast per parameter, reused by every forward inside
        first, second = model(input_ids=ids).logits, model(input_ids=ids).logits
    model(input_ids=ids)
    model(input_ids=ids)
    assert torch.equal(first, second) and weights[0].dtype == torch.bfloat16
    assert weights[0] is weights[1] and weights[2] is not weights[3]  # outside: a fresh cast per forward


def test_a_failed_cast_leaves_the_hooks_balanced(tmp_path, monkeypatch):
    """A cast that fails in the pre-hook (say, out of memory) must not unbalance the nesting count: the next forward
    still computes in the compute dtype, and the parameters are the fp32 ones outside forward."""
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec())
    model = apply_compute_dtype(build_model(ModelConfig(path=str(model_dir), dtype="bfloat16"), "actor"),
                                torch.bfloat16)
    casts = getattr(model, _STATE_ATTRIBUTE)
    ids = torch.randint(4, 60, (2, 7))
    real_casts = casts._casts
    monkeypatch.setattr(casts, "_casts", lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("simulated")))
    with pytest.raises(torch.OutOfMemoryError):
        model(input_ids=ids)
    monkeypatch.setattr(casts, "_casts", real_casts)
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    model(input_ids=ids)
    assert seen == [torch.bfloat16] and casts.depth == 0
    assert all(isinstance(param, torch.nn.Parameter) for param in model.parameters())


def test_casting_inputs_and_outputs_leaves_the_callers_containers_alone():
    Pair = namedtuple("Pair", "values ids")
    inner = {"x": torch.ones(2)}
    cast = _cast_floats({"inner": inner, "pair": Pair(torch.ones(2), torch.arange(2))}, torch.bfloat16)
    assert inner["x"].dtype == torch.float32  # the caller's dict is not rewritten
    assert cast["inner"]["x"].dtype == torch.bfloat16 and isinstance(cast["pair"], Pair)
    assert cast["pair"].values.dtype == torch.bfloat16 and cast["pair"].ids.dtype == torch.int64


def wrap_with_bf16_reduction(rank, world, model_dir, out_path):
    model = build_model(ModelConfig(path=str(model_dir), dtype="bfloat16"), "actor")
    shard_model(model, init_device_mesh("cpu", (1,)), ShardingOptions(
        compute_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, keep_gathered=True))
    torch.save(isinstance(model, FSDPModule), out_path)


def test_a_bf16_reduce_dtype_keeps_fsdp2(tmp_path):
    """``fsdp.reduce_dtype=bfloat16`` accumulates gradients in bf16 under FSDP2; the single-rank path only does fp32,
    so that setting keeps the FSDP2 model (one group) rather than silently changing the numerics."""
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec())
    run_on_gloo(1, wrap_with_bf16_reduction, model_dir, tmp_path / "out.pt")
    assert torch.load(tmp_path / "out.pt") is True

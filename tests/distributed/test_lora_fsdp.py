"""LoRA (PEFT) on the FSDP2 actor over 2 real gloo ranks: what trains, the reference, merged sync, checkpoints.

References are written out here with plain transformers on one process: the base model loaded from disk, and the
merged weight ``W + (alpha / r) · B A`` computed from the gathered adapter tensors.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from gloo_spawn import run_on_gloo
from hybridrl.config.schema import LoraConfig, ModelConfig, OptimConfig
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching

pytestmark = pytest.mark.distributed

BATCH, PROMPT, RESPONSE = 8, 4, 5
RANK, ALPHA = 4, 8.0
LORA = LoraConfig(rank=RANK, alpha=ALPHA, target_modules=["q_proj", "v_proj", "down_proj"])


def make_data() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 60, (BATCH, PROMPT + RESPONSE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[::3, :2] = 0  # some left padding
    attention_mask[1::2, -2:] = 0  # some short responses
    input_ids = input_ids * attention_mask
    return dict(input_ids=input_ids, attention_mask=attention_mask, responses=input_ids[:, PROMPT:].clone(),
                response_mask=attention_mask[:, PROMPT:].clone(),
                advantages=torch.randn(BATCH, RESPONSE, generator=generator),
                old_log_probs=-torch.rand(BATCH, RESPONSE, generator=generator) * 3)


def log_probs(model, data) -> torch.Tensor:
    """``[B, R]`` response log-probs with a plain forward (the single-process reference)."""
    mask = data["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=data["input_ids"], attention_mask=mask, position_ids=positions, use_cache=False).logits
    logits = logits[:, PROMPT - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, data["responses"].unsqueeze(-1)).squeeze(-1) * data["response_mask"]


def full_params(model) -> dict[str, torch.Tensor]:
    return {name: param.detach().full_tensor().clone() for name, param in model.named_parameters()}


def run_rank(rank, world, model_dir, data, checkpoint_dir, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    from hybridrl.hybrid_engine import WeightResharder
    from hybridrl.engines.checkpoint import load_sharded, save_sharded
    from hybridrl.modeling.fsdp import ShardingOptions, shard_model
    from hybridrl.hybrid_engine.lora_weights import MergedLoraWeights
    from hybridrl.modeling.lora import adapters_disabled
    from hybridrl.modeling.model_builder import build_model
    from hybridrl.engines.optim import build_optimizer, build_scheduler

    model = build_model(ModelConfig(path=str(model_dir), dtype="float32", lora=LORA), "actor")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
    optim = OptimConfig(lr=1e-2)
    optimizer = build_optimizer(model, optim)
    engine = TrainingEngine(model, dp=DataParallelGroup(rank=rank, size=world),
                            micro_batching=MicroBatching(micro_batch_size=2), optimizer=optimizer,
                            scheduler=build_scheduler(optimizer, optim, 10))
    loss = PolicyLoss(forward=SequenceForward(), temperature=1.0)
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    batch = Batch(tensors={name: tensor[local] for name, tensor in data.items()})
    before = full_params(model)
    for step in range(2):
        engine.train_epochs(batch, loss, mini_batch_size=len(batch), seed=step)
    after = full_params(model)
    with torch.no_grad():
        lora_log_probs = log_probs(model, data)
        with adapters_disabled(model):
            ref_log_probs = log_probs(model, data)
    resharder = WeightResharder(model, tp_size=1, bucket_bytes=1 << 14, source=MergedLoraWeights(model))
    streamed = {name: tensor.clone() for name, tensor in resharder.stream()}

    save_sharded(checkpoint_dir, model, optimizer, engine.scheduler, trainable_only=True)
    saved = full_params(model)
    engine.train_epochs(batch, loss, mini_batch_size=len(batch), seed=7)
    moved = full_params(model)
    load_sharded(checkpoint_dir, model, optimizer, engine.scheduler, trainable_only=True)
    if rank == 0:
        torch.save(dict(before=before, after=after, lora_log_probs=lora_log_probs, ref_log_probs=ref_log_probs,
                        streamed=streamed, saved=saved, moved=moved, loaded=full_params(model)), out_path)
    else:
        full_params(model)  # the gather is a collective


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    model_dir = save_tiny_model(root / "model")
    data = make_data()
    run_on_gloo(2, run_rank, model_dir, data, str(root / "ckpt"), root / "out.pt")
    return model_dir, data, root / "ckpt", torch.load(root / "out.pt")


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def test_training_changes_only_adapter_parameters(results):
    _, _, _, out = results
    before, after = out["before"], out["after"]
    adapters = [name for name in before if is_adapter(name)]
    assert len(adapters) == 2 * 2 * 3  # 2 layers × 3 target modules × (A, B)
    for name in before:
        if is_adapter(name):
            assert not torch.equal(before[name], after[name]), name
        else:
            assert torch.equal(before[name], after[name]), name


def reference_merged(out, model_dir) -> dict[str, torch.Tensor]:
    """The slow reference: the base model's weights, plus ``alpha / r · B A`` on each adapted layer."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    after = out["after"]
    merged = dict(base)
    for name in after:
        if ".lora_A." in name:
            prefix = name.split(".lora_A.")[0]
            hf = prefix.removeprefix("base_model.model.") + ".weight"
            lora_b = after[name.replace(".lora_A.", ".lora_B.")]
            merged[hf] = base[hf] + (ALPHA / RANK) * lora_b @ after[name]
    return merged


def test_reference_log_probs_are_the_base_models(results):
    model_dir, data, _, out = results
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        expected = log_probs(base, data)
    assert torch.allclose(out["ref_log_probs"], expected, atol=1e-5)
    assert (out["lora_log_probs"] - expected).abs().max() > 1e-3  # the adapters did move the policy


def test_synced_weights_are_the_merged_model(results):
    model_dir, data, _, out = results
    merged = reference_merged(out, model_dir)
    streamed = out["streamed"]
    assert set(streamed) == set(merged)
    for name, tensor in merged.items():
        assert torch.allclose(streamed[name], tensor, atol=1e-6), name
    engine = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine.load_state_dict(streamed)  # what an HF engine holds after the sync
    with torch.no_grad():
        assert torch.allclose(log_probs(engine, data), out["lora_log_probs"], atol=1e-5)


def test_checkpoint_holds_and_restores_the_adapters_only(results):
    from torch.distributed.checkpoint import FileSystemReader

    _, _, checkpoint_dir, out = results
    keys = FileSystemReader(f"{checkpoint_dir}/dcp").read_metadata().state_dict_metadata
    model_keys = [key for key in keys if key.startswith("model.")]
    assert model_keys and all(is_adapter(key) for key in model_keys)
    for name in out["saved"]:
        assert torch.equal(out["loaded"][name], out["saved"][name]), name
    assert any(not torch.equal(out["moved"][name], out["saved"][name]) for name in out["saved"])

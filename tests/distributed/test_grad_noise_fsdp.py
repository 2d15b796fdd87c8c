"""Per-micro-batch gradient norms under real FSDP2 on 2 gloo ranks, measured inside the unchanged accumulation loop.

Each rank runs ``TrainingEngine.optimizer_step`` (2 micro-batches, gradient sync only on the last) with a hook that
starts a ``MicroBatchGradNorms`` measurement before each micro-batch. The hooks sit on FSDP2's *unsharded* parameters, so every sample must equal the squared norm
of that micro-batch's own token-mean gradient on a plain single-process model, and the pre-clip gradient norm of the
step must equal the whole mini-batch's. Also with bf16 mixed precision (the unsharded parameters are bf16 there).

The same FSDP2 set-up also checks the memory side of accumulation: the probe's measured peak per rank (with and
without FSDP2's unsharded no-sync gradients) against ``memory_sizing``'s analytic model.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_spawn import run_on_gloo
from transformers import AutoModelForCausalLM

from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.hooks import StepHook
from hybridrl.engines.losses import SequenceForward, SFTLoss
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.autotune.grad_noise import GradientNoiseScale, GradientSample, MicroBatchGradNorms, summarize
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.sequences import response_log_probs

pytestmark = pytest.mark.distributed

BATCH, PROMPT, RESPONSE, WORLD, MICRO = 8, 5, 6, 2, 2
RESPONSE_LENGTHS = [6, 1, 4, 2, 6, 3, 1, 5]


def make_data() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 60, (BATCH, PROMPT + RESPONSE), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, response) in enumerate(zip([5, 1, 3, 5, 2, 4, 5, 3], RESPONSE_LENGTHS)):
        attention_mask[row, PROMPT - prompt:PROMPT + response] = 1
    return dict(input_ids=input_ids * attention_mask, attention_mask=attention_mask,
                response_mask=attention_mask[:, PROMPT:].clone())


class Measure(StepHook):
    """Starts measuring each micro-batch (what ``NoiseScaleMonitor`` does before the step's estimate)."""

    def __init__(self, norms: MicroBatchGradNorms) -> None:
        self.norms = norms

    def before_micro_batch(self, micro_batch, normalizer, agg_mode, dp_size) -> None:
        self.norms.measure(micro_batch, normalizer, agg_mode, dp_size)


def measure_on_rank(rank, world, model_dir, data, compute_dtype, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    from hybridrl.modeling.fsdp import ShardingOptions, shard_model
    from hybridrl.engines.optim import build_optimizer, build_scheduler

    model = build_model(ModelConfig(path=str(model_dir)), "actor")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions(compute_dtype=compute_dtype))
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3))
    dp = DataParallelGroup(rank=rank, size=world)
    norms = MicroBatchGradNorms(model)
    engine = TrainingEngine(model, dp=dp, micro_batching=MicroBatching(micro_batch_size=MICRO), optimizer=optimizer,
                            scheduler=build_scheduler(optimizer, OptimConfig(), 4), grad_clip=1e9,
                            hooks=[Measure(norms)])
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    batch = Batch(tensors={name: tensor[local] for name, tensor in data.items()})
    metrics = engine.optimizer_step(batch, SFTLoss(SequenceForward()))
    samples = norms.finish()
    summary = summarize(samples, dp)
    estimate = GradientNoiseScale().update(summary, GradientSample(norms.global_batch_size, metrics["grad_norm"] ** 2))
    gathered = [None] * world
    dist.all_gather_object(gathered, [(sample.batch_size, sample.sq_norm) for sample in samples])
    if rank == 0:
        torch.save(dict(samples=gathered, summary=(summary.sum_sq_norm, summary.sum_inverse_batch, summary.count),
                        grad_norm=metrics["grad_norm"], global_batch=norms.global_batch_size,
                        b_simple=estimate.b_simple, hooked=len(norms._hooked),
                        num_parameters=len(list(model.parameters()))), out_path)


def reference_sq_norm(model_dir, data, rows) -> float:
    """Squared norm of the token-mean NLL gradient of ``rows`` alone, on a plain fp32 model."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    mask = data["response_mask"][rows]
    log_probs, _ = response_log_probs(model, data["input_ids"][rows], data["attention_mask"][rows], RESPONSE)
    (-(log_probs * mask).sum() / mask.sum()).backward()
    return sum(float(param.grad.pow(2).sum()) for param in model.parameters())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("grad_noise") / "model")


@pytest.mark.parametrize("compute_dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)],
                         ids=["fp32", "bf16-mixed"])
def test_micro_batch_norms_under_fsdp2(model_dir, tmp_path, compute_dtype, tolerance):
    data = make_data()
    out_path = tmp_path / "result.pt"
    run_on_gloo(WORLD, measure_on_rank, model_dir, data, compute_dtype, out_path)
    result = torch.load(out_path)
    assert result["hooked"] == result["num_parameters"]  # one hook per unsharded parameter, none duplicated
    micro_rows = [list(range(start, start + MICRO)) for start in range(0, BATCH, MICRO)]  # rank 0: 0-3, rank 1: 4-7
    samples = [sample for rank_samples in result["samples"] for sample in rank_samples]  # (batch_size, sq_norm)
    assert [batch_size for batch_size, _ in samples] == [
        float(sum(RESPONSE_LENGTHS[row] for row in rows)) for rows in micro_rows]
    for (_, sq_norm), rows in zip(samples, micro_rows):
        assert sq_norm == pytest.approx(reference_sq_norm(model_dir, data, rows), rel=tolerance)
    assert result["global_batch"] == sum(RESPONSE_LENGTHS)
    big = reference_sq_norm(model_dir, data, list(range(BATCH)))
    assert result["grad_norm"] ** 2 == pytest.approx(big, rel=tolerance)
    sum_sq_norm, sum_inverse_batch, count = result["summary"]
    assert count == 4
    assert sum_sq_norm == pytest.approx(sum(sq_norm for _, sq_norm in samples))
    assert sum_inverse_batch == pytest.approx(sum(1 / batch_size for batch_size, _ in samples))
    assert result["b_simple"] > 0


def probe_on_rank(rank, world, model_dir, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    from hybridrl.modeling.attention import CPU_ATTENTION  # what model.attn_implementation=auto builds on CPU
    from hybridrl.modeling.fsdp import ShardingOptions, shard_model
    from hybridrl.autotune.memory_sizing import DecoderShape, Precision, estimate_micro_batch_bytes, probe_peak_bytes

    model = build_model(ModelConfig(path=str(model_dir)), "actor")
    shape = DecoderShape.from_hf_config(model.config)
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
    dp = DataParallelGroup(rank=rank, size=world)
    rows = []
    for accumulating in (False, True):
        for micro_batch_size, seq_len in ((4, 64), (8, 128)):
            measured = probe_peak_bytes(model, micro_batch_size, seq_len, accumulating=accumulating, dp=dp)
            predicted = estimate_micro_batch_bytes(shape, micro_batch_size, seq_len, world_size=world,
                                                   accumulating=accumulating, attention=CPU_ATTENTION,
                                                   precision=Precision(optimizer_bytes_per_param=0)).total
            rows.append((accumulating, micro_batch_size, seq_len, measured, predicted))
    if rank == 0:
        torch.save(rows, out_path)


def test_memory_probe_under_fsdp2_matches_the_analytic_model(tmp_path):
    from hybridrl.utils.tiny_model import TinyModelSpec

    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(hidden_size=256, num_layers=4, num_heads=8,
                                                                  num_kv_heads=2, intermediate_size=688))
    run_on_gloo(WORLD, probe_on_rank, model_dir, tmp_path / "rows.pt")
    for accumulating, micro_batch_size, seq_len, measured, predicted in torch.load(tmp_path / "rows.pt"):
        assert measured == pytest.approx(predicted, rel=0.10), (accumulating, micro_batch_size, seq_len)

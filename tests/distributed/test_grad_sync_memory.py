"""The memory side of ``fsdp.grad_sync``: on 2 gloo ranks under real FSDP2, the probe's measured per-rank peak of two
accumulated micro-batches drops, with ``micro_batch`` instead of ``step``, by the whole model's unsharded fp32
gradients that FSDP2 no longer holds between micro-batches, less this rank's shard of them (which ``micro_batch``
accumulates into) — and by no less than the analytic model's drop, which also charges the gradients in flight of the
root group and one layer at the peak.

Both modes are measured after a warm-up probe: the first forward/backward under FSDP2 creates the unsharded parameter
storages once (later all-gathers refill them in place), which ``LiveTensorPeak`` would charge to whichever mode ran
first.
"""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import run_on_gloo

from hybridrl.config.schema import ModelConfig
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.engines.micro_batches import DataParallelGroup
from hybridrl.modeling.model_builder import build_model

pytestmark = pytest.mark.distributed

WORLD = 2
# Many thin layers: each layer's in-flight gradient is a small part of the model, as in a real LLM.
SPEC = TinyModelSpec(hidden_size=128, num_layers=8, num_heads=4, num_kv_heads=2, intermediate_size=512)
MICRO_BATCH, SEQ_LEN = 2, 32


def probe_both_modes(rank, world, model_dir, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    from hybridrl.modeling.fsdp import ShardingOptions, shard_model
    from hybridrl.autotune.memory_sizing import probe_peak_bytes

    model = build_model(ModelConfig(path=str(model_dir)), "actor")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
    dp = DataParallelGroup(rank=rank, size=world)
    probe_peak_bytes(model, MICRO_BATCH, SEQ_LEN, accumulating=False, dp=dp)  # warm-up (module docstring)
    peaks = {grad_sync: probe_peak_bytes(model, MICRO_BATCH, SEQ_LEN, grad_sync=grad_sync, dp=dp)
             for grad_sync in ("step", "micro_batch")}
    if rank == 0:
        torch.save((peaks, model.config), out_path)


def test_micro_batch_sync_drops_the_unsharded_gradients(tmp_path):
    from hybridrl.autotune.memory_sizing import DecoderShape, Precision, estimate_micro_batch_bytes

    model_dir = save_tiny_model(tmp_path / "model", SPEC)
    run_on_gloo(WORLD, probe_both_modes, model_dir, tmp_path / "peaks.pt")
    peaks, hf_config = torch.load(tmp_path / "peaks.pt", weights_only=False)
    shape = DecoderShape.from_hf_config(hf_config)
    predicted = {grad_sync: estimate_micro_batch_bytes(shape, MICRO_BATCH, SEQ_LEN, world_size=WORLD,
                                                       accumulating=grad_sync == "step",
                                                       precision=Precision(optimizer_bytes_per_param=0))
                 for grad_sync in ("step", "micro_batch")}
    unsharded_gradients = predicted["step"].states.accumulated_gradients
    assert unsharded_gradients == 4 * shape.num_parameters()
    shard = predicted["micro_batch"].states.gradients
    assert shard == 4 * shape.num_parameters() // WORLD
    measured_drop = peaks["step"] - peaks["micro_batch"]
    predicted_drop = predicted["step"].total - predicted["micro_batch"].total
    print(f"peak per rank: step {peaks['step'] / 2**20:.2f} MiB, micro_batch {peaks['micro_batch'] / 2**20:.2f} MiB; "
          f"drop {measured_drop / 2**20:.2f} MiB (analytic {predicted_drop / 2**20:.2f}; unsharded fp32 gradients "
          f"{unsharded_gradients / 2**20:.2f} MiB less the {shard / 2**20:.2f} MiB shard = "
          f"{(unsharded_gradients - shard) / 2**20:.2f} MiB)")
    assert predicted_drop > 0.25 * unsharded_gradients  # the bound below is not vacuous
    assert 0.95 * predicted_drop <= measured_drop <= 1.05 * (unsharded_gradients - shard)

"""The resharding plan over NCCL on 2 GPUs: FSDP2 training shards → t_g = 2 slices, checked, and the transport choice.

Skipped without 2 CUDA devices (the one GPU machine these sessions borrow has one). On CPU the same plan runs over
gloo in ``tests/distributed/test_resharding.py``; here the wire is NCCL point-to-point (``batch_isend_irecv``), the
buffers and fingerprints live on the GPU, and ``method="shared"`` (host memory) must be refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from gloo_spawn import run_on_gloo  # noqa: E402

from hybridrl.hybrid_engine import WeightResharder  # noqa: E402
from hybridrl.hybrid_engine.plan import box_slices  # noqa: E402
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2,
                                                  reason="needs 2 CUDA devices (NCCL point-to-point between them)")]


def nccl_worker(rank: int, world_size: int, model_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    from hybridrl.modeling.fsdp import ShardingOptions, shard_model

    reference = {name: tensor.to(torch.bfloat16) for name, tensor in
                 AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()}
    model = AutoModelForCausalLM.from_pretrained(model_dir).cuda()
    shard_model(model, init_device_mesh("cuda", (world_size,)), ShardingOptions())
    with pytest.raises(ValueError, match="on a GPU use method='plan'"):
        WeightResharder(model, tp_size=2, bucket_bytes=1 << 20, dtype=torch.bfloat16, method="shared")
    resharder = WeightResharder(model, tp_size=2, bucket_bytes=1 << 20, dtype=torch.bfloat16)
    assert resharder.method == "plan"  # auto on a GPU: NCCL point-to-point
    for name, piece in resharder.stream(checked=True):
        assert piece.is_cuda
        assert torch.equal(piece.cpu(), reference[name][box_slices(resharder.regions[name])]), name
    resharder.verify()
    torch.cuda.synchronize()


def test_plan_over_nccl_delivers_exact_tensor_parallel_slices(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4,
                                                                  num_kv_heads=2, intermediate_size=256))
    run_on_gloo(2, nccl_worker, str(model_dir), backend="nccl")

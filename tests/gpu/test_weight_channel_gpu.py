"""``rollout.weight_transfer=collective`` on GPU: the trainer's rows travel over NCCL, buffers on the devices.

Skipped without 2 CUDA devices (NCCL joins each device once per group, so a one-GPU machine cannot run it). One
trainer rank on ``cuda:0`` sends to a replica rank on ``cuda:1``; on CPU the same runs over gloo with two of each in
``tests/distributed/test_weight_channel.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from gloo_spawn import run_on_gloo  # noqa: E402
from test_weight_channel import publish_twice_over_a_channel  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2,
                                                  reason="needs 2 CUDA devices (NCCL between a trainer and a replica)")]


def test_trainer_rank_sends_published_rows_to_a_replica_over_nccl():
    run_on_gloo(2, publish_twice_over_a_channel, 1, "nccl", backend="nccl")

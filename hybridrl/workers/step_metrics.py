"""The resource metrics every training update returns: memory (``memory/*``) and time in collectives (``comm/*``)."""

from __future__ import annotations

import torch

from hybridrl.utils.collectives import CollectiveTimer
from hybridrl.utils.memory import max_over_ranks, memory_metrics

# comm/<key>: the collective kinds an FSDP2 update issues (CollectiveTimer's names).
COMM_KEYS = (("comm/grad_reduce_s", "reduce_scatter"), ("comm/param_gather_s", "all_gather"),
             ("comm/all_reduce_s", "all_reduce"), ("comm/sequence_parallel_s", "sequence_parallel"))
# comm/<key>_bytes: what each kind moved (CollectiveTimer.payload_bytes' names; the planner predicts the same figures).
BYTE_KEYS = (("comm/grad_reduce_bytes", "reduce_scatter"), ("comm/grad_all_reduce_bytes", "fsdp_all_reduce"),
             ("comm/param_gather_bytes", "all_gather"), ("comm/all_reduce_bytes", "all_reduce"),
             ("comm/sequence_parallel_bytes", "sequence_parallel"))


def update_resource_metrics(device: torch.device, dp, comm: CollectiveTimer) -> dict[str, float]:
    """``memory/*`` (see :func:`memory_metrics`) and the seconds this update spent in collectives, each the maximum
    over the data-parallel ranks ``dp`` (the slowest rank sets the pace):

    - ``comm/grad_reduce_s``: gradient reduce-scatters (FSDP2 reduces each shard group's gradients once per optimizer
      step with ``fsdp.grad_sync=step``, after every micro-batch with ``micro_batch``) — the gradient all-reduce time;
    - ``comm/param_gather_s``: parameter all-gathers (forward, and again in backward);
    - ``comm/all_reduce_s``: small all-reduces (global token count, metrics, the clip norm);
    - ``comm/sequence_parallel_s``: Ulysses sequence parallelism's all-to-alls and gathers of activations (0 unless
      ``*.ulysses_sequence_parallel_size`` > 1).

    All three are 0 on one rank (FSDP2 communicates nothing). On a GPU they are measured on the streams the
    collectives run on, so they include time overlapped with compute; on CPU (gloo) collectives block.

    And the bytes of the tensors the collectives were about (:func:`~hybridrl.utils.collectives.payload_bytes`:
    gathered parameters, unreduced gradients), which ``hybridrl plan`` predicts per phase:
    ``comm/param_gather_bytes``, ``comm/grad_reduce_bytes``, ``comm/grad_all_reduce_bytes`` (HSDP's all-reduce of
    the reduced gradient shards across shard groups), ``comm/all_reduce_bytes`` (the small ones) and
    ``comm/sequence_parallel_bytes`` (activations exchanged by sequence parallelism).
    """
    seconds = comm.seconds()
    figures = {key: seconds.get(kind, 0.0) for key, kind in COMM_KEYS}
    figures.update({key: float(comm.payload_bytes.get(kind, 0)) for key, kind in BYTE_KEYS})
    return max_over_ranks({**memory_metrics(device), **figures}, device, dp)

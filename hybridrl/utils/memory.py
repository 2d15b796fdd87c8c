"""Memory figures of this process for the step metrics (and so the Prometheus endpoint and dashboard)."""

from __future__ import annotations

import resource

import torch

from hybridrl.utils.host_memory import host_rss_bytes

GIB = 2**30
# CUDA allocator figures (metric key, torch.cuda function name); the peak counter is reset after each read.
CUDA_MEMORY_KEYS = (("memory/device_allocated_gib", "memory_allocated"),
                    ("memory/device_reserved_gib", "memory_reserved"),
                    ("memory/device_peak_allocated_gib", "max_memory_allocated"))


def memory_metrics(device: torch.device) -> dict[str, float]:
    """This process's ``memory/host_rss_gib``, ``memory/host_peak_rss_gib`` and, on CUDA,
    ``memory/device_allocated_gib``, ``memory/device_reserved_gib`` and ``memory/device_peak_allocated_gib`` — the
    allocator's peak since the previous call (the counter is reset, so each step reports its own peak). Workers report
    the worst rank's figures (:func:`max_over_ranks`): the worst rank is the one that runs out of memory."""
    metrics = {"memory/host_rss_gib": host_rss_bytes() / GIB,
               "memory/host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}
    if device.type == "cuda":
        metrics.update({key: getattr(torch.cuda, function)(device) / GIB for key, function in CUDA_MEMORY_KEYS})
        torch.cuda.reset_peak_memory_stats(device)
    return metrics


def max_over_ranks(metrics: dict[str, float], device: torch.device, dp=None) -> dict[str, float]:
    """Each figure's maximum over the data-parallel group ``dp`` (one all-reduce; unchanged without a group of several
    ranks), so every rank returns the same metrics."""
    if dp is None or dp.size <= 1 or not metrics:
        return metrics
    import torch.distributed as dist

    values = torch.tensor(list(metrics.values()), dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=dp.group)
    return dict(zip(metrics, values.tolist()))

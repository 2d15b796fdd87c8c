"""``CollectiveTimer`` on 2 real gloo ranks: a blocking all-reduce that waits for a late rank is charged that wait;
FSDP2's gradient reduce-scatters and parameter all-gathers are seen and timed; async calls are counted, not timed."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from gloo_spawn import run_on_gloo
from hybridrl.utils.collectives import CollectiveCounter, CollectiveTimer, collective_kind

pytestmark = pytest.mark.distributed

LATE_S = 0.4


def timer_rank(rank: int, world: int) -> None:
    original = dist.all_reduce
    dist.barrier()
    with CollectiveTimer() as timer:
        assert dist.all_reduce is not original
        if rank == 1:
            time.sleep(LATE_S)  # rank 0 enters the all-reduce first and waits for rank 1
        entered = time.time()
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    seconds = timer.seconds()
    assert set(seconds) == {"all_reduce"} and timer.untimed == {"all_reduce": 1}
    assert dist.all_reduce is original  # restored on exit
    # How long rank 0 really waited: both ranks share this machine's clock. (A fixed bound on LATE_S failed when a
    # loaded machine scheduled rank 0 out of the barrier tens of milliseconds after rank 1.)
    entries = torch.zeros(world, dtype=torch.float64)
    entries[rank] = entered
    dist.all_reduce(entries)
    wait = float(entries[1] - entries[0])
    if rank == 0:
        assert wait > LATE_S / 2, entries  # rank 1 was late
        assert seconds["all_reduce"] >= wait * 0.9, (seconds, wait)
    else:
        assert seconds["all_reduce"] < LATE_S / 2, seconds

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with CollectiveTimer() as timer, CollectiveCounter() as counter:
        model(torch.randn(3, 8)).square().mean().backward()
    seconds = timer.seconds()
    assert counter.total("reduce_scatter") == 2 and counter.total("all_gather") >= 2, counter.counts
    assert seconds["reduce_scatter"] > 0 and seconds["all_gather"] > 0, seconds


def test_timer_charges_waits_and_sees_fsdp2_collectives():
    run_on_gloo(2, timer_rank)


@pytest.mark.parametrize("name, kind", [("reduce_scatter_single", "reduce_scatter"),
                                        ("functional.reduce_scatter_tensor", "reduce_scatter"),
                                        ("all_gather_into_tensor", "all_gather"), ("all_gather", "all_gather"),
                                        ("all_to_all_single", "all_to_all"), ("broadcast", "broadcast")])
def test_collective_kind(name, kind):
    assert collective_kind(name) == kind

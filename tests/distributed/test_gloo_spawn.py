"""The gloo test harness reports a failing rank's own assertion, even when its peer fails in a collective too, and
reuses its rank processes only while each call leaves them as it found them."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_spawn import GlooRankError, run_on_gloo

pytestmark = pytest.mark.distributed


def rank_one_asserts(rank, world):
    if rank == 1:
        assert rank == 0, "rank 1 disagrees"
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that has gone


def test_a_failing_rank_assertion_reaches_the_caller():
    with pytest.raises(GlooRankError) as failure:
        run_on_gloo(2, rank_one_asserts)
    report = str(failure.value)
    assert report.startswith("--- rank 1 ---") and "AssertionError: rank 1 disagrees" in report


def ranks_agree(rank, world):
    total = torch.ones(1)
    dist.all_reduce(total)
    assert float(total) == world


def test_passing_ranks_raise_nothing():
    run_on_gloo(2, ranks_agree)


def record_pid(rank, world, directory):
    Path(directory, f"rank{rank}.pid").write_text(str(os.getpid()))


def pids(directory, world=2):
    return [int(Path(directory, f"rank{rank}.pid").read_text()) for rank in range(world)]


def change_process_state(rank, world, directory):
    os.environ["GLOO_POOL_TEST"] = "set by a test"
    torch.set_default_dtype(torch.float64)
    record_pid(rank, world, directory)


def see_process_state(rank, world, directory):
    assert "GLOO_POOL_TEST" not in os.environ and torch.get_default_dtype() == torch.float32
    record_pid(rank, world, directory)


def leave_a_thread_running(rank, world, directory):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    record_pid(rank, world, directory)


def fail_on_rank_one(rank, world, directory):
    rank_one_asserts(rank, world)


def die_once(rank, world, directory):
    marker = Path(directory, f"died{rank}")
    if rank == 1 and not marker.exists():
        marker.write_text("")
        os._exit(3)  # as a signal would: no exception, the process is gone
    dist.all_reduce(torch.ones(1))
    record_pid(rank, world, directory)


def test_calls_reuse_processes_and_each_sees_a_fresh_state(tmp_path):
    run_on_gloo(2, change_process_state, str(tmp_path))
    first = pids(tmp_path)
    run_on_gloo(2, see_process_state, str(tmp_path))  # the environment and default dtype were put back
    assert pids(tmp_path) == first
    run_on_gloo(2, see_process_state, str(tmp_path), fresh=True)
    assert set(pids(tmp_path)).isdisjoint(first)


@pytest.mark.parametrize("spoil", [leave_a_thread_running, fail_on_rank_one], ids=["thread left", "failed"])
def test_a_call_that_spoils_its_processes_gets_them_replaced(tmp_path, spoil):
    run_on_gloo(2, record_pid, str(tmp_path))
    before = pids(tmp_path)
    if spoil is fail_on_rank_one:
        with pytest.raises(GlooRankError, match="rank 1 disagrees"):
            run_on_gloo(2, spoil, str(tmp_path))
    else:
        run_on_gloo(2, spoil, str(tmp_path))
    run_on_gloo(2, record_pid, str(tmp_path))
    assert set(pids(tmp_path)).isdisjoint(before)


def test_a_rank_that_dies_is_retried_once_on_new_processes(tmp_path):
    with pytest.warns(UserWarning, match="gloo rank 1 died"):
        run_on_gloo(2, die_once, str(tmp_path))
    assert len(set(pids(tmp_path))) == 2

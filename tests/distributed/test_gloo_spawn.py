"""The gloo test harness reports a failing rank's own assertion, even when its peer fails in a collective too."""

from __future__ import annotations

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

"""Declared dispatch without Ray: the decorators, and how a call is planned (who gets what) and gathered."""

from __future__ import annotations

import inspect

import pytest
import torch
from sample_workers import EchoWorker, make_batch

from hybridrl.runtime import Dispatch, DispatchedMethod, Worker, one_to_all
from hybridrl.runtime.dispatch import plan_call
from hybridrl.protocol import Batch


def plan(method, world_size, args=(), kwargs=None, tp_size=1, shared=None, sp_size=1):
    """Plan with a recording ``share`` so tests see what would be stored once in the object store."""
    store = shared if shared is not None else []

    def share(value):
        store.append(value)
        return value

    return plan_call(method, world_size, tp_size, tuple(args), dict(kwargs or {}), share, sp_size)


def test_decorated_method_is_the_plain_method_on_an_instance_and_the_descriptor_on_the_class():
    method = EchoWorker.add_offset
    assert isinstance(method, DispatchedMethod)
    assert method.spec.mode is Dispatch.DP_SPLIT and method.name == "add_offset"
    assert method.qualname == "EchoWorker.add_offset"
    worker = EchoWorker.__new__(EchoWorker)
    assert inspect.ismethod(worker.add_offset) and worker.add_offset.__func__ is method.fn
    assert EchoWorker.all_reduce_sum.spec.collect_first and not EchoWorker.rank_info.spec.collect_first
    assert EchoWorker.count_rows.spec.pad is False


def test_go_to_definition_target_is_the_worker_def():
    """What an IDE jumps to from ``group.call(EchoWorker.add_offset, ...)``: the ``def`` in the worker's class body."""
    source_file = inspect.getsourcefile(EchoWorker.add_offset.fn)
    lines, _ = inspect.getsourcelines(EchoWorker.add_offset.fn)
    assert source_file is not None and source_file.endswith("sample_workers.py")
    assert any(line.strip().startswith("def add_offset(") for line in lines)
    assert EchoWorker.add_offset.__wrapped__ is EchoWorker.add_offset.fn
    assert EchoWorker.add_offset.__doc__ == EchoWorker.add_offset.fn.__doc__


def test_one_to_all_rejects_an_unknown_collect():
    with pytest.raises(ValueError, match="collect"):
        one_to_all(collect="last")  # type: ignore[call-overload]


@pytest.mark.parametrize("rows,world", [(8, 2), (7, 2), (10, 4), (3, 4), (1, 4)])
def test_dp_split_pads_chunks_and_unpads(rows, world):
    batch = make_batch(rows)
    call = plan(EchoWorker.add_offset, world, (batch,), {"scale": 2.0})
    assert sorted(call.rank_args) == list(range(world))
    chunk_sizes = {len(args[0]) for args, _ in call.rank_args.values()}
    assert chunk_sizes == {-(-rows // world)}
    assert all(kwargs == {"scale": 2.0} for _, kwargs in call.rank_args.values())
    # every rank echoes its chunk: the gather must give back exactly the input rows, in order
    echoed = {rank: args[0] for rank, (args, _) in call.rank_args.items()}
    gathered = call.collect(echoed)
    assert torch.equal(gathered["ids"], batch["ids"]) and list(gathered["tag"]) == list(batch["tag"])


def test_dp_split_without_padding_refuses_uneven_batches():
    with pytest.raises(ValueError, match="divisible by the data-parallel size 2"):
        plan(EchoWorker.count_rows, 2, (make_batch(7),))
    call = plan(EchoWorker.count_rows, 2, (make_batch(8),))
    assert call.collect({0: 4, 1: 4}) == [4, 4]  # non-Batch results come back per rank


def test_dp_split_needs_a_batch_and_equal_lengths():
    with pytest.raises(TypeError, match="passed no Batch"):
        plan(EchoWorker.add_offset, 2, (), {"scale": 1.0})

    class TwoBatches(Worker):
        from hybridrl.runtime import dp_split

        @dp_split
        def pair(self, left: Batch, right: Batch) -> Batch:
            return left

    with pytest.raises(ValueError, match="different lengths"):
        plan(TwoBatches.pair, 2, (make_batch(4), make_batch(5)))
    call = plan(TwoBatches.pair, 2, (make_batch(4),), {"right": make_batch(4)})
    assert all(len(kwargs["right"]) == 2 for _, kwargs in call.rank_args.values())


def test_unpadded_split_cuts_batches_of_different_lengths_each_evenly():
    """An update with an RL batch and a smaller SFT batch (PPO-ptx): each is chunked on its own, none padded."""

    class Update(Worker):
        from hybridrl.runtime import dp_split

        @dp_split(pad=False)
        def update(self, rl: Batch, sft: Batch | None = None) -> int:
            return len(rl)

    rl, sft = make_batch(8), make_batch(4)
    call = plan(Update.update, 2, (rl,), {"sft": sft})
    for rank, (args, kwargs) in call.rank_args.items():
        assert torch.equal(args[0]["x"], rl["x"][4 * rank:4 * rank + 4])
        assert torch.equal(kwargs["sft"]["x"], sft["x"][2 * rank:2 * rank + 2])
    assert call.collect({0: 4, 1: 4}) == [4, 4]
    with pytest.raises(ValueError, match="divisible by the data-parallel size 2"):
        plan(Update.update, 2, (rl,), {"sft": make_batch(3)})


def test_gather_refuses_to_unpad_when_rows_do_not_match_inputs():
    call = plan(EchoWorker.add_offset, 2, (make_batch(3),))
    with pytest.raises(ValueError, match="same whole number of rows per input row"):
        call.collect({0: make_batch(2), 1: make_batch(1)})


def test_gather_unpads_methods_that_return_several_rows_per_input():
    """Generation returns n responses per prompt, consecutively; padding prompts' responses must all go."""
    batch = make_batch(3)
    call = plan(EchoWorker.add_offset, 2, (batch,))
    echoed = {rank: args[0].repeat_interleave(3) for rank, (args, _) in call.rank_args.items()}
    gathered = call.collect(echoed)
    assert gathered["ids"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_dp_leaders_gives_tp_peers_the_same_chunk_and_gathers_leaders_only():
    shared: list = []
    batch = make_batch(5)
    call = plan(EchoWorker.leader_echo, 4, (batch,), tp_size=2, shared=shared)
    chunks = {rank: args[0] for rank, (args, _) in call.rank_args.items()}
    assert chunks[0] is chunks[1] and chunks[2] is chunks[3] and chunks[0] is not chunks[2]
    assert len(shared) == 2  # one stored copy per DP replica, not per rank
    gathered = call.collect({0: chunks[0], 2: chunks[2]})
    assert torch.equal(gathered["ids"], batch["ids"])


def test_dp_split_gives_sequence_parallel_peers_the_same_rows_and_gathers_leaders_only():
    """Ranks that split each sequence (``sp_size``, Ulysses) get the same rows; a tensor-parallel size does not change
    a ``dp_split`` call (it is the rollout's layout, not the trainer's)."""
    batch = make_batch(6)
    call = plan(EchoWorker.add_offset, 4, (batch,), tp_size=4, sp_size=2)
    chunks = {rank: args[0] for rank, (args, _) in call.rank_args.items()}
    assert chunks[0] is chunks[1] and chunks[2] is chunks[3] and len(chunks[0]) == 3
    assert torch.equal(call.collect({0: chunks[0], 1: "follower", 2: chunks[2], 3: "follower"})["ids"], batch["ids"])
    whole = plan(EchoWorker.add_offset, 4, (batch,), tp_size=4)
    assert [len(args[0]) for args, _ in whole.rank_args.values()] == [2, 2, 2, 2]


def test_one_to_all_stores_large_arguments_once_and_inlines_scalars():
    shared: list = []
    weights = torch.ones(4)
    call = plan(EchoWorker.rank_info, 3, (weights, 2, "x"), shared=shared)  # planning does not bind arguments
    assert shared == [weights]
    assert all(args == (weights, 2, "x") for args, _ in call.rank_args.values())
    assert call.collect({0: "a", 1: "b", 2: "c"}) == ["a", "b", "c"]


def test_values_bound_for_one_rank_are_passed_as_they_are():
    """An explicit ``ray.put`` costs milliseconds whatever the size: a value only one rank reads goes as it is (Ray
    inlines a small one and stores a large one itself) — every argument of a one-rank group, each DP chunk."""
    shared: list = []
    weights, batch = torch.ones(4), make_batch(6)
    one_rank = plan(EchoWorker.rank_info, 1, (weights,), shared=shared)
    assert one_rank.rank_args[0][0][0] is weights and shared == []
    split = plan(EchoWorker.add_offset, 2, (batch, weights), shared=shared)
    assert [len(args[0]) for args, _ in split.rank_args.values()] == [3, 3]
    assert shared == [weights]  # the broadcast value is still stored once for both ranks; the chunks are not
    split_one = plan(EchoWorker.add_offset, 1, (batch, weights), shared=shared)
    assert shared == [weights] and torch.equal(split_one.rank_args[0][0][0]["ids"], batch["ids"])


def test_rank_zero_runs_on_rank_zero_only():
    call = plan(EchoWorker.whoami, 4, ("t",))
    assert list(call.rank_args) == [0]
    assert call.collect({0: ("t", 0)}) == ("t", 0)

"""The controller's ``Generation`` over replicas it does not know the placement of: chunks and their seeds, a dead
replica's chunk resubmitted with the same seed, every row's ``policy_version``, a sync as one publish then one load
per live replica, queued loads and relabels. The replicas here sample in this process (one thread each, calls in
the order made, as a worker group runs them); ``tests/distributed/test_rollout_pool.py`` drives the same
``Generation`` over real vLLM replicas."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import pytest
import torch

from hybridrl.protocol import Batch, Fields
from hybridrl.replicas import Publication, Replica, WeightTransfer
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime.errors import WorkerDiedError
from hybridrl.trainers.generation import Generation, chunk_params
from hybridrl.utils.seeding import derive_seed

RESPONSE_LENGTH = 3


def sampled(prompt_ids: torch.Tensor, seed: Optional[int], weights: int) -> torch.Tensor:
    """What a replica holding ``weights`` draws for one prompt: a pure function of the prompt, seed and weights."""
    generator = torch.Generator().manual_seed(hash((tuple(prompt_ids.tolist()), seed, weights)) % 2**31)
    return torch.randint(0, 1000, (RESPONSE_LENGTH,), generator=generator)


class ThreadReplica(Replica):
    """A replica in this process: runs its calls in order on one thread, holds a weights version."""

    def __init__(self, name: str) -> None:
        self.name, self.calls, self.weights, self.held = name, [], 0, 0
        self._thread = ThreadPoolExecutor(max_workers=1)
        self.killed = self.stopped = False

    @property
    def is_stopped(self) -> bool:
        return self.stopped

    def kill(self, noticed: bool = True) -> None:
        """Its process is gone; ``noticed=False``: the controller learns it at the next call (a group stops when a
        call finds a rank dead)."""
        self.killed, self.stopped = True, noticed

    def _run(self, what: str, work):
        self.calls.append(what)

        def run():
            if self.killed:
                self.stopped = True
                raise WorkerDiedError(self.name, 0, what, None, "killed by the test")
            return work()
        return self._thread.submit(run)

    def generate(self, prompts: Batch, params: SamplingParams, policy_version: int):
        def work() -> Batch:
            assert self.held == policy_version, "generation asked for another version than the replica holds"
            responses = torch.stack([sampled(row, params.seed, self.weights) for row in prompts[Fields.PROMPTS]])
            return Batch({Fields.PROMPTS: prompts[Fields.PROMPTS], Fields.RESPONSES: responses})
        return self._run("generate", work)

    def update_weights(self, publication: Optional[Publication], policy_version: int):
        def work() -> dict[str, float]:
            self.weights, self.held = publication.rows[0], policy_version
            return {"weight_sync/seconds": 0.0}
        return self._run(f"load {policy_version}", work)

    def relabel_weights(self, policy_version: int):
        def work() -> None:
            self.held = policy_version
        return self._run(f"relabel {policy_version}", work)


class CountingTransfer(WeightTransfer):
    """Publishes the trainer's "weights" (a counter the test sets) once per sync."""

    def __init__(self) -> None:
        self.trainer_weights, self.published = 0, []

    def publish(self, replicas: Sequence[int], policy_version: int) -> Publication:
        self.published.append((list(replicas), policy_version))
        self.publish_seconds = 0.5
        return Publication(layout=None, expected=None, rows=[self.trainer_weights])


def prompts(count: int) -> Batch:
    return Batch({Fields.PROMPTS: torch.arange(count * 2).reshape(count, 2)})


def expected_rows(batch: Batch, sizes: list[int], params: SamplingParams, weights: int) -> torch.Tensor:
    """The rows chunk ``i`` of ``sizes`` gives with ``chunk_params(params, i)``, whoever samples it."""
    chunks = batch.split(sizes)
    return torch.cat([torch.stack([sampled(row, chunk_params(params, index).seed, weights)
                                   for row in chunk[Fields.PROMPTS]]) for index, chunk in enumerate(chunks)])


@pytest.fixture
def three():
    replicas = [ThreadReplica(f"rollout{index}") for index in range(3)]
    return Generation(replicas, CountingTransfer()), replicas


def test_a_batch_is_cut_into_one_chunk_per_replica_seeded_by_position(three):
    generation, replicas = three
    params = SamplingParams(n=1, seed=7)
    rows = generation.generate(prompts(8), params)
    assert [replica.calls for replica in replicas] == [["generate"]] * 3
    assert torch.equal(rows[Fields.RESPONSES], expected_rows(prompts(8), [3, 3, 2], params, weights=0))
    assert rows[Fields.POLICY_VERSION].tolist() == [0] * 8
    assert chunk_params(params, 0) == params  # the first chunk keeps the batch's seed
    assert chunk_params(params, 2).seed == derive_seed(7, "replica", 2)
    assert chunk_params(SamplingParams(seed=None), 2).seed is None


def test_a_dead_replicas_chunk_is_resubmitted_with_its_own_seed(three, caplog):
    generation, replicas = three
    params = SamplingParams(n=1, seed=11)
    all_alive = generation.generate(prompts(6), params)
    replicas[1].kill(noticed=False)
    rows = generation.generate(prompts(6), params)
    assert torch.equal(rows[Fields.RESPONSES], all_alive[Fields.RESPONSES])
    assert "rollout1" in caplog.text and "resubmitted to 'rollout0'" in caplog.text
    assert replicas[0].calls == ["generate", "generate", "generate"]
    assert generation.replicas_lost == 1
    after = generation.generate(prompts(6), params)  # two live replicas now: two chunks
    assert torch.equal(after[Fields.RESPONSES], expected_rows(prompts(6), [3, 3], params, weights=0))


def test_a_sync_publishes_once_then_every_live_replica_loads_in_order(three):
    generation, replicas = three
    transfer = generation.transfer
    transfer.trainer_weights = 5
    metrics = generation.sync_weights(1)
    assert transfer.published == [([0, 1, 2], 1)]
    assert metrics == {"weight_sync/seconds": 0.0, "rollout/replicas_live": 3.0, "rollout/replicas_lost": 0.0,
                       "weight_sync/publish_seconds": 0.5}
    assert all(replica.calls == ["load 1"] for replica in replicas)
    rows = generation.generate(prompts(3), SamplingParams(seed=1))
    assert rows[Fields.POLICY_VERSION].tolist() == [1, 1, 1]
    assert torch.equal(rows[Fields.RESPONSES], expected_rows(prompts(3), [1, 1, 1], SamplingParams(seed=1), 5))
    replicas[2].kill()
    generation.sync_weights(2)
    assert transfer.published[-1] == ([0, 1], 2)  # a stopped replica is neither published to nor loaded


def test_a_sync_that_does_not_wait_returns_the_previous_loads_metrics_and_is_queued_behind_generation(three):
    generation, replicas = three
    first = generation.submit(prompts(3), SamplingParams(seed=3))
    assert generation.sync_weights(1, wait=False) == {"weight_sync/publish_seconds": 0.5}  # nothing loaded before
    second = generation.submit(prompts(3), SamplingParams(seed=3))
    assert first.result()[Fields.POLICY_VERSION].tolist() == [0, 0, 0]  # submitted before the sync
    assert second.result()[Fields.POLICY_VERSION].tolist() == [1, 1, 1]
    assert replicas[0].calls == ["generate", "load 1", "generate"]
    assert generation.sync_weights(2, wait=False)["rollout/replicas_live"] == 3.0  # the loads of version 1


def test_advance_relabels_without_publishing(three):
    generation, replicas = three
    generation.advance(1)
    generation.advance(1)  # already there: nothing
    assert generation.transfer.published == []
    rows = generation.generate(prompts(3), SamplingParams(seed=2))
    assert rows[Fields.POLICY_VERSION].tolist() == [1, 1, 1]
    assert all(replica.calls == ["relabel 1", "generate"] for replica in replicas)


def test_when_every_replica_is_gone_the_error_reaches_the_caller(three):
    generation, replicas = three
    for replica in replicas:
        replica.kill()
    with pytest.raises(RuntimeError, match="every rollout replica has died"):
        generation.generate(prompts(3), SamplingParams())
    with pytest.raises(ValueError, match="at least one replica"):
        Generation([], CountingTransfer())

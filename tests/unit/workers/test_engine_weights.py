"""The colocated engine's weights under the trainer's one ``policy_version`` (``hybridrl/workers/engine_weights.py``):
a real ``WeightResharder`` over a one-rank FSDP2 model streams into an engine that keeps what it receives."""

from __future__ import annotations

import pytest
import torch

from hybridrl.hybrid_engine import WeightResharder
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.utils.distributed import build_device_meshes, full_tensor, init_single_rank_group, leave_process_group
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.workers.engine_weights import EngineWeights, StaleEngineWeightsError


class KeepingEngine:
    """An engine's receiving end: keeps each streamed tensor and the version it was given."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.policy_version = None

    def update_weights(self, named_tensors, policy_version=None) -> None:
        self.weights = {name: tensor.clone() for name, tensor in named_tensors}
        self.policy_version = policy_version


@pytest.fixture(scope="module")
def sharded_model():
    created = init_single_rank_group("cpu")
    mesh, _ = build_device_meshes("cpu", 1, 1)
    model = shard_model(build_tiny_model(TinyModelSpec(), 64, pad_token_id=0, eos_token_id=1), mesh,
                        ShardingOptions())
    yield model
    if created:
        leave_process_group()


def checked_weights(model, loaded_current=True) -> EngineWeights:
    return EngineWeights(WeightResharder(model, tp_size=1, bucket_bytes=1 << 20, method="plan"), verify=True,
                         loaded_current=loaded_current)


def test_a_sync_labels_the_engine_with_the_trainers_version(sharded_model):
    weights, engine = checked_weights(sharded_model), KeepingEngine()
    weights.require_current()  # loaded from model.path: current at version 0
    assert weights.policy_version == 0
    weights.actor_changed()
    with pytest.raises(StaleEngineWeightsError, match="holds the weights of version 0 .* a weight sync was skipped"):
        weights.require_current()
    weights.sync(engine, policy_version=3)
    weights.require_current()
    assert weights.policy_version == engine.policy_version == 3
    expected = {name: full_tensor(parameter.detach()) for name, parameter in sharded_model.named_parameters()}
    assert set(engine.weights) >= set(expected)
    for name, tensor in expected.items():
        assert torch.equal(engine.weights[name], tensor), name
    weights.sync(engine)  # no version given: the next one
    assert engine.policy_version == weights.policy_version == 4


def test_relabelling_moves_nothing_and_is_refused_once_the_actor_changed(sharded_model):
    weights, engine = checked_weights(sharded_model), KeepingEngine()
    weights.relabel(1)  # critic warm-up: the actor is unchanged, its weights count as step 1's
    assert weights.policy_version == 1 and engine.weights == {}
    weights.actor_changed()
    with pytest.raises(StaleEngineWeightsError, match="a weight sync was skipped"):
        weights.relabel(2)
    weights.sync(engine, policy_version=2)
    weights.relabel(3)
    assert weights.policy_version == 3 and engine.policy_version == 2  # the engine's own label moves with a sync


def test_random_engine_weights_must_be_synced_before_generating(sharded_model):
    weights = checked_weights(sharded_model, loaded_current=False)
    assert weights.policy_version is None
    with pytest.raises(StaleEngineWeightsError, match="random weights"):
        weights.require_current()
    weights.sync(KeepingEngine(), policy_version=0)
    weights.require_current()

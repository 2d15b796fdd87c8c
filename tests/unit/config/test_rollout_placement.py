"""Where the rollout engines run (``config/rollout_placement.py``): ``rollout.engine_process`` resolved against the
model's architecture as the installed vLLM serves it, and the combinations that mean nothing refused by key."""

from __future__ import annotations

import json

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.config.rollout_placement import (colocated_replicas, replica_count, resolved_engine_process,
                                               served_through_transformers_backend)
from hybridrl.replicas import role_pools, rollout_replica_roles
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A native architecture (Llama) and one vLLM serves through its Transformers backend (OLMo-2)."""
    root = tmp_path_factory.mktemp("placement_models")
    return {name: str(save_tiny_model(root / name, TinyModelSpec(architecture=name, vocab_size=128)))
            for name in ("llama", "olmo2")}


def test_the_installed_vllm_serves_olmo2_through_its_transformers_backend_and_llama_natively(models):
    assert served_through_transformers_backend(models["olmo2"]) == ["Olmo2ForCausalLM"]
    assert served_through_transformers_backend(models["llama"]) == []


@pytest.mark.parametrize(("model", "overrides", "where", "replicas"), [
    ("llama", ["rollout=hf"], "actor", 0),
    ("llama", ["rollout=vllm_cpu"], "actor", 0),  # auto: in the actor where it can be
    ("olmo2", ["rollout=vllm_cpu"], "own", 2),  # auto: the engine would patch the actor's model class
    ("olmo2", ["rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2"], "own", 1),
    ("llama", ["rollout=vllm_cpu", "rollout.engine_process=own"], "own", 2),
    ("llama", ["rollout=vllm_cpu", "trainer.n_gpus_per_node=1", "rollout.n_gpus=1"], "own", 1),  # the pool
])
def test_engine_process_resolves_by_engine_pool_and_architecture(models, model, overrides, where, replicas):
    config = load_config([f"model.path={models[model]}", "trainer.n_gpus_per_node=2", *overrides])
    assert resolved_engine_process(config) == where
    assert replica_count(config) == replicas
    colocated = where == "own" and config.rollout.n_gpus == 0
    assert colocated_replicas(config) == colocated
    # colocated replicas share the actor's pool (a role of it); a pool's replicas get pools of their own
    pools = role_pools(config)
    assert ("rollout" in pools.roles_in("global")) == colocated
    assert rollout_replica_roles(config) == ([] if colocated else [f"rollout{i}" for i in range(replicas)])


def test_an_engine_forced_into_the_actor_is_refused_for_a_transformers_backend_architecture(models):
    with pytest.raises(ConfigError, match=r"rollout.engine_process='actor'.*Transformers backend.*processes of its"):
        load_config([f"model.path={models['olmo2']}", "rollout=vllm_cpu", "rollout.engine_process=actor"])


@pytest.mark.parametrize(("overrides", "phrase"), [
    (["rollout.engine_process=elsewhere"], "expected one of auto, actor, own"),
    (["rollout=hf", "rollout.engine_process=own"], "rollout.name=hf generates with the actor's own module"),
    (["rollout=vllm_cpu", "trainer.n_gpus_per_node=1", "rollout.n_gpus=1", "rollout.engine_process=actor"],
     "set rollout.n_gpus=0"),
])
def test_engine_process_combinations_that_mean_nothing_are_refused_by_key(overrides, phrase):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides, check_paths=False)
    assert "rollout.engine_process" in caught.value.keys, str(caught.value)
    assert phrase in str(caught.value)


def test_colocated_replicas_use_the_weight_transfer_checks(models):
    with pytest.raises(ConfigError, match="rollout.weight_transfer"):
        load_config([f"model.path={models['llama']}", "rollout=vllm_cpu", "rollout.engine_process=own",
                     "rollout.weight_transfer=carrier_pigeon"])


def test_an_unreadable_model_config_resolves_to_the_actor(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    from hybridrl.config.rollout_placement import model_architectures

    assert model_architectures(str(tmp_path)) == ()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"architectures": ["Olmo2ForCausalLM"]}))
    assert served_through_transformers_backend(str(tmp_path / "other")) == ["Olmo2ForCausalLM"]


# A recipe's own engines, registered from a plugin file: one on vLLM's request queue, one that generates in batches.
ENGINE_PLUGIN = """
from hybridrl.rollout import ROLLOUT_ENGINES
from hybridrl.rollout.hf import HFRollout
from hybridrl.rollout.vllm_engine import VLLMRollout

@ROLLOUT_ENGINES.register("queued_engine", override=True)
class QueuedEngine(VLLMRollout):
    pass

@ROLLOUT_ENGINES.register("batch_engine", override=True)
class BatchEngine(HFRollout):
    pass
"""


@pytest.mark.parametrize(("engine", "accepted"), [("vllm", True), ("queued_engine", True), ("hf", False),
                                                  ("batch_engine", False)])
def test_multi_turn_needs_an_engine_with_a_request_queue_whoever_registered_it(tmp_path, engine, accepted):
    plugin = tmp_path / "engines.py"
    plugin.write_text(ENGINE_PLUGIN)
    overrides = [f"trainer.plugins=[{plugin}]", f"rollout.name={engine}", "rollout.multi_turn.enable=true"]
    if accepted:
        assert load_config(overrides, check_paths=False).rollout.name == engine
        return
    # a batch engine on the actor's own module has no weights to hold in processes of its own
    with pytest.raises(ConfigError, match=rf"rollout.name={engine} generates with the actor's own module"):
        load_config([f"trainer.plugins=[{plugin}]", f"rollout.name={engine}", "rollout.engine_process=own"],
                    check_paths=False)
    with pytest.raises(ConfigError, match=rf"request queue.*rollout.name='{engine}' does not have.*serves_requests"):
        load_config(overrides, check_paths=False)


@pytest.mark.parametrize("engine", ["hf", "batch_engine"])
def test_a_standalone_pool_of_an_engine_on_the_actors_module_is_refused_naming_it(tmp_path, engine):
    plugin = tmp_path / "engines.py"
    plugin.write_text(ENGINE_PLUGIN)
    with pytest.raises(ConfigError, match=rf"rollout.n_gpus=1: rollout.name={engine} generates with the actor's own "
                                          r"module; a standalone pool needs rollout.name=vllm"):
        load_config([f"trainer.plugins=[{plugin}]", f"rollout.name={engine}", "trainer.n_gpus_per_node=1",
                     "rollout.n_gpus=1"], check_paths=False)

"""The CPU twin of ``recipes/ppo_7b_2x2_a10g.sh``: PPO with a critic and a reward model of another tokenizer (a tiny
random DeBERTa-v2 scalar head with its own vocabulary, as DeBERTa-v3-large would be) on a simulated 2-node Ray
cluster of 2 ranks each, actor and critic sharded within a node and replicated across (HSDP 2 x 2), each
all-reducing across nodes once per micro-batch as the planner chose for 24 GB devices, and 4 micro-batches of 1
sequence per rank per optimizer step.

The planner's byte counts hold on it (actor and critic, ``comm/*_bytes``), every role trains, and the reward
model really scores re-tokenised text. This module owns its Ray session (a local instance is not a cluster other
raylets can join)."""

from __future__ import annotations

import pytest
from simulated_cluster import simulated_nodes
from transformers import AutoModelForSequenceClassification, DebertaV2Config

from hybridrl.config import load_config
from hybridrl.planner.comm_plan import LINKS, Topology, plan_communication
from hybridrl.planner.report import shapes_of
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import DEFAULT_CHARACTERS, build_char_tokenizer, save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long, pytest.mark.timeout(900)]

@pytest.fixture(scope="module")
def cluster_address():
    with simulated_nodes(2, cpus_per_node=2) as address:
        yield address


def save_deberta_reward_model(directory):
    """A random DeBERTa-v2 (v3's architecture) with one label and its own character vocabulary (reversed order and
    three more characters than the policy's)."""
    tokenizer = build_char_tokenizer(DEFAULT_CHARACTERS[::-1] + "XYZ")
    config = DebertaV2Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=128, max_position_embeddings=256, num_labels=1,
                             pad_token_id=tokenizer.pad_token_id, relative_attention=True, position_buckets=32,
                             pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_ppo_with_critic_and_another_tokenizers_reward_model_on_two_nodes(cluster_address, tmp_path):
    policy = save_tiny_model(tmp_path / "policy")
    reward = save_deberta_reward_model(tmp_path / "reward")
    hsdp = ["fsdp.fsdp_size=2", "fsdp.grad_sync=micro_batch", "fsdp.defer_all_reduce=false",
            "fsdp.gather_once=false"]  # as auto resolves on several GPUs (on CPU it gathers once)
    config = load_config([
        f"model.path={policy}", "model.dtype=float32", f"trainer.default_local_dir={tmp_path / 'run'}",
        f"trainer.ray.address={cluster_address}", "trainer.nnodes=2", "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.save_at_end=false", "trainer.critic_warmup=0", "algorithm=gae",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "data.train_batch_size=8",
        "data.max_response_length=3", "rollout.n=2",
        "actor.ppo_mini_batch_size=8", "actor.ppo_micro_batch_size_per_gpu=1",  # 16 sequences = 1 x 4 x 4 ranks
        "critic.ppo_mini_batch_size=8", "critic.ppo_micro_batch_size_per_gpu=1",
        *(f"actor.{key}" for key in hsdp), *(f"critic.{key}" for key in hsdp),
        "reward_model.enable=true", f"reward_model.model_path={reward}", "reward_fusion.rm_weight=1.0",
    ])
    trainer = RLTrainer(config)
    assert trainer.fit().global_step == 2
    for group in (trainer.actor, trainer.critic):  # node by node: ranks 0-1 on one raylet, 2-3 on the other
        nodes = [location.node_id for location in group.locations]
        assert len(nodes) == 4 and nodes[0] == nodes[1] != nodes[2] == nodes[3]
    rows = read_metrics(tmp_path / "run")
    planned = plan_communication(config, shapes_of(config), Topology(2, 2, LINKS["pcie"], LINKS["1gbe"]),
                                 compute={}).plan
    for row in rows:
        assert row["reward/rm/std"] > 0  # the DeBERTa model scored the re-tokenised responses
        assert "critic/vf_loss" in row and "actor/pg_loss" in row
        for role in ("actor", "critic"):
            assert row[f"{role}/comm/grad_all_reduce_bytes"] == planned.phase_bytes(f"update_{role}",
                                                                                    "fsdp_all_reduce") > 0
            assert row[f"{role}/comm/grad_reduce_bytes"] == planned.phase_bytes(f"update_{role}", "reduce_scatter")
            assert row[f"{role}/comm/param_gather_bytes"] == planned.phase_bytes(f"update_{role}", "all_gather")

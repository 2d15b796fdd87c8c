"""The planner's communication model: FSDP2's padded payloads against real models' parameters, the collectives of an
update counted by hand, ring times over a node's link and the network, the overlap with compute, link presets and
the ``plan`` command's section. (Byte counts against the engine's own collectives: tests/e2e/test_planner_comm_bytes.py.)"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForTokenClassification

from hybridrl.autotune.decoder_shape import DecoderShape
from hybridrl.cli import main
from hybridrl.planner.comm_plan import (LINKS, ShardLayout, Topology, gathered_elements, micro_batch_comm_seconds,
                                        overlapped_seconds, parse_link, update_collectives)
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

GB = 1e9


def padded_elements(model: torch.nn.Module, group: int) -> int:
    """FSDP2's all-gather size from the module itself: every parameter's rows padded to a multiple of ``group``."""
    total = 0
    for param in model.parameters():
        rows = param.shape[0]
        total += -(-rows // group) * group * (param.numel() // rows)
    return total


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "mixtral", "qwen3_moe"])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_gathered_elements_equal_the_padded_parameters_of_real_models(architecture, group, tmp_path):
    spec = TinyModelSpec(architecture=architecture, hidden_size=96, num_heads=3, num_kv_heads=1,
                         intermediate_size=80, vocab_size=101)
    model = build_tiny_model(spec, 101, pad_token_id=0, eos_token_id=1)
    shape = DecoderShape.from_hf_config(model.config)
    assert gathered_elements(shape, group) == padded_elements(model, group)
    model.config.num_labels = 1
    with torch.device("meta"):
        critic = AutoModelForTokenClassification.from_config(model.config)
    assert gathered_elements(shape, group, head="value") == padded_elements(critic, group)


def layout(**changes) -> ShardLayout:
    values = dict(shard_group=4, replicas=1, optimizer_steps=2, micro_batches=4, gather_once=False,
                  grad_sync="step", compute_bytes=2, reduce_bytes=4)
    return ShardLayout(**{**values, **changes})


SHAPE = DecoderShape(2, 64, 128, 2, 1, 32, 80)  # every row count a multiple of 4: no padding
P = SHAPE.num_parameters()
ONE_NODE = Topology(1, 4, LINKS["pcie"], LINKS["1gbe"])


def kinds(collectives):
    return {c.kind: (c.calls, c.payload_bytes) for c in collectives}


def test_update_collectives_counted_by_hand():
    assert kinds(update_collectives("u", SHAPE, layout(), ONE_NODE)) == {
        "all_gather": (2 * 2 * 4, 2 * P), "reduce_scatter": (2, 4 * P)}  # forward + backward per micro-batch
    assert kinds(update_collectives("u", SHAPE, layout(gather_once=True, grad_sync="micro_batch"), ONE_NODE)) == {
        "all_gather": (2, 2 * P), "reduce_scatter": (2 * 4, 4 * P)}
    hsdp = layout(shard_group=2, replicas=2)  # 2 shard groups of 2 ranks: each reduced half all-reduced across them
    assert kinds(update_collectives("u", SHAPE, hsdp, ONE_NODE))["fsdp_all_reduce"] == (2, 4 * P // 2)
    every = kinds(update_collectives("u", SHAPE, layout(shard_group=2, replicas=2, grad_sync="micro_batch"), ONE_NODE))
    assert every["reduce_scatter"][0] == 2 * 4 and every["fsdp_all_reduce"][0] == 2  # once per optimizer step
    assert update_collectives("u", SHAPE, layout(shard_group=1), ONE_NODE) == []  # one rank: nothing moves


def test_ring_times_over_a_node_and_across_nodes():
    payload = 8 * GB
    pcie, gbe = LINKS["pcie"], LINKS["1gbe"]
    two_nodes = Topology(2, 2, pcie, gbe)
    # a shard group in a node
    assert two_nodes.ring_seconds(payload, 2, 1) == pytest.approx(payload / 2 / pcie.bytes_per_second + pcie.latency_s)
    assert not two_nodes.crosses_nodes(2, 1)
    # 4 ranks over 2 nodes: one ring leaves each node, its interface carries (4 - 1)/4 of the payload
    assert two_nodes.ring_seconds(payload, 4, 1) == pytest.approx(0.75 * payload / gbe.bytes_per_second + gbe.latency_s)
    # HSDP's all-reduce of each of a node's 2 shards: 2 rings of 2 replicas leave the node at once, twice (reduce + gather)
    assert two_nodes.ring_seconds(payload, 2, 2, passes=2) == pytest.approx(
        2 * 2 * 0.5 * payload / gbe.bytes_per_second + gbe.latency_s)
    assert two_nodes.crosses_nodes(2, 2)
    assert two_nodes.ring_seconds(payload, 1, 1) == 0


def test_a_micro_batch_costs_the_larger_of_its_compute_and_its_communication():
    update = update_collectives("u", SHAPE, layout(optimizer_steps=1, micro_batches=3), ONE_NODE)
    gather = next(c for c in update if c.kind == "all_gather")
    reduce = next(c for c in update if c.kind == "reduce_scatter")
    schedule = micro_batch_comm_seconds(layout(optimizer_steps=1, micro_batches=3), update)
    assert schedule == pytest.approx([2 * gather.seconds / 6] * 2 + [2 * gather.seconds / 6 + reduce.seconds])
    assert overlapped_seconds(1e6, layout(optimizer_steps=1, micro_batches=3), update) == pytest.approx(1e6)
    assert overlapped_seconds(0.0, layout(optimizer_steps=1, micro_batches=3), update) == pytest.approx(sum(schedule))


def test_links_by_name_or_gigabits():
    assert parse_link("1GbE") == LINKS["1gbe"] and parse_link("ib").bytes_per_second == 25 * GB
    assert parse_link("40").bytes_per_second == pytest.approx(5 * GB)
    for bad in ("fast", "-1", "0", "inf"):
        with pytest.raises(ValueError, match="Gbit/s"):
            parse_link(bad)


JOB = ["--no-check-paths", "model.path=qwen2.5-7b", "model.dtype=bfloat16", "trainer.nnodes=2",
       "trainer.n_gpus_per_node=2", "data.train_batch_size=256", "rollout.n=4", "actor.ppo_mini_batch_size=256",
       "actor.ppo_micro_batch_size_per_gpu=8", "actor.fsdp.grad_sync=step"]


def test_plan_shows_communication_over_gigabit_ethernet(capsys):
    main(["plan", "--gpu", "a10g", "--network", "1gbe", *JOB])
    out = capsys.readouterr().out
    assert "between nodes 1 Gb Ethernet" in out and re.search(r"update_actor +reduce_scatter", out)
    hsdp, full = (float(line.split("step")[1].split("s;")[0]) for line in out.splitlines()
                  if line.strip().startswith(("HSDP:", "full shard")))
    assert hsdp < full  # all-gathers inside a node, one all-reduce of a shard per step across nodes
    assert "accumulation 32 (micro-batch 8)" in out and "accumulation  1 (micro-batch 256)" in out


def test_plan_refuses_an_unknown_network_in_one_line(capsys):
    assert main(["plan", "--network", "fast", *JOB]) == 2
    assert "unknown link 'fast'" in capsys.readouterr().err

"""The job planner: its memory model against measured CPU allocation of a real tiny model (parameters, gradients,
optimizer states in fp32 and 8-bit, activations with and without checkpointing), the phase and role arithmetic by
hand, the recommender's headroom rule, the FLOP model against torch's FLOP counter, and the ``plan`` command."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hybridrl.cli import main
from hybridrl.config import load_config
from hybridrl.config.precision import precision_mode
from hybridrl.config.sizes import role_plan
from hybridrl.planner import Shapes, gpu_spec, plan_job, plan_memory, recommend, roofline_step_time
from hybridrl.planner.memory_plan import trained_role
from hybridrl.planner.time_plan import forward_flops, matmul_parameters
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.autotune.memory_sizing import DecoderShape, ForwardLayout, probe_peak_bytes
from hybridrl.engines.optim import build_optimizer
from hybridrl.config.schema import OptimConfig

TOLERANCE = 0.10  # as the activation-peak tests of the memory model: transients are modelled per step
QWEN_7B = DecoderShape(num_layers=28, hidden_size=3584, intermediate_size=18944, num_heads=28, num_kv_heads=4,
                       head_dim=128, vocab_size=152064, qkv_bias=True)
GIB = 2**30


def tiny_model(checkpointing=False):
    spec = TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=320)
    model = build_tiny_model(spec, 2048, pad_token_id=0, eos_token_id=1).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


@pytest.mark.parametrize("state_precision,checkpointing", [("fp32", False), ("fp32", True), ("8bit", False)],
                         ids=["fp32", "fp32-checkpointing", "8bit-states"])
def test_predicted_actor_memory_matches_measured_cpu_allocation(state_precision, checkpointing):
    if state_precision == "8bit":
        pytest.importorskip("torchao")
    model = tiny_model(checkpointing)
    optimizer = build_optimizer(model, OptimConfig(state_precision=state_precision))
    model(torch.randint(0, 2048, (1, 4))).logits.sum().backward()
    optimizer.step()  # optimizer states now exist, as in every step after the first
    micro_batch, seq_len = 4, 64
    measured = probe_peak_bytes(model, micro_batch, seq_len, optimizer=optimizer)
    mode = precision_mode("float32", "float32", state_precision, False)  # a single CPU process computes in fp32
    predicted = trained_role("actor", DecoderShape.from_hf_config(model.config),
                             ForwardLayout.padded(micro_batch, seq_len, seq_len - 2), world=1, mode=mode,
                             accumulating=True, checkpointing=checkpointing, param_offload=False)
    print(f"{state_precision} checkpointing={checkpointing}: predicted {predicted.total / 2**20:.2f} MiB "
          f"(states {(predicted.total - predicted.activations) / 2**20:.2f}, activations "
          f"{predicted.activations / 2**20:.2f}), measured {measured / 2**20:.2f} MiB, "
          f"ratio {predicted.total / measured:.3f}")
    assert predicted.total == pytest.approx(measured, rel=TOLERANCE)


def big_job(*overrides):
    return load_config(["model.path=/nonexistent", "data.max_prompt_length=1024", "data.max_response_length=1024",
                        "data.train_batch_size=256", "rollout.n=4", "actor.ppo_mini_batch_size=64",
                        "actor.ppo_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=8", "model.dtype=bfloat16",
                        "rollout.name=vllm", "rollout.gpu_memory_utilization=0.4", "trainer.device=cuda", *overrides],
                       check_paths=False)


def test_roles_and_phases_by_hand():
    config = big_job("actor.use_kl_loss=true", "rollout.free_cache_engine=true")
    plan = plan_memory(config, Shapes(QWEN_7B), gpu_spec("a100-80").memory_bytes)
    total = QWEN_7B.num_parameters()
    per_rank = -(-total // 8)
    actor, ref, rollout = plan.roles["actor"], plan.roles["ref"], plan.roles["rollout"]
    assert actor.parameters == 4 * per_rank and actor.optimizer == 8 * per_rank
    assert actor.gradients == 4 * total  # accumulating (32 local sequences, micro 4): FSDP2 holds full gradients
    assert ref.parameters == 4 * per_rank and ref.gradients == ref.optimizer == 0
    assert rollout.parameters == 2 * total and rollout.kv_cache > 0
    assert rollout.total == pytest.approx(0.4 * plan.device_bytes, rel=0.02)
    resident = actor.resident + ref.resident + plan.roles["buffers"].total
    assert plan.phases["generate"] == resident + rollout.total  # vLLM has its own weights: nothing of the actor gathered
    hf = plan_memory(big_job("actor.use_kl_loss=true", "rollout.name=hf"), Shapes(QWEN_7B), plan.device_bytes)
    assert hf.phases["generate"] == resident + hf.roles["rollout"].total + actor.buffers  # decodes on the actor
    # the engine sleeps outside generation: the update phase holds no rollout memory
    assert plan.phases["update_actor"] == resident + actor.gradients + actor.activations + actor.buffers
    awake = plan_memory(big_job("actor.use_kl_loss=true", "rollout.free_cache_engine=false"), Shapes(QWEN_7B),
                        plan.device_bytes)
    assert awake.phases["update_actor"] - plan.phases["update_actor"] == rollout.total
    offloaded = plan_memory(big_job("actor.use_kl_loss=true", "actor.fsdp.optimizer_offload=true"), Shapes(QWEN_7B),
                            plan.device_bytes)
    assert plan.phases["generate"] - offloaded.phases["generate"] == actor.optimizer


def test_hsdp_states_are_sharded_over_the_shard_group_only():
    device = gpu_spec("a100-80").memory_bytes
    plain = plan_memory(big_job("actor.use_kl_loss=true"), Shapes(QWEN_7B), device)
    hsdp = plan_memory(big_job("actor.use_kl_loss=true", "actor.fsdp.fsdp_size=4"), Shapes(QWEN_7B), device)
    per_rank_of_4 = -(-QWEN_7B.num_parameters() // 4)
    for role in ("actor", "ref"):
        assert hsdp.roles[role].parameters == 4 * per_rank_of_4 and plain.roles[role].parameters < per_rank_of_4 * 4
    assert hsdp.roles["actor"].optimizer == 8 * per_rank_of_4


def test_eight_bit_states_shrink_the_optimizer_term():
    standard = plan_memory(big_job(), Shapes(QWEN_7B), gpu_spec("h100").memory_bytes)
    eight_bit = plan_memory(big_job("actor.optim.state_precision=8bit"), Shapes(QWEN_7B), gpu_spec("h100").memory_bytes)
    ratio = eight_bit.roles["actor"].optimizer / standard.roles["actor"].optimizer
    assert ratio == pytest.approx((2 + 8 / 256) / 8, rel=1e-6)


def test_recommendation_keeps_the_headroom_and_takes_the_largest_micro_batch():
    config = big_job("actor.ppo_micro_batch_size_per_gpu=1", "model.enable_gradient_checkpointing=true")
    shapes, device = Shapes(QWEN_7B), gpu_spec("h200").memory_bytes
    advice = recommend(config, shapes, device, headroom=0.15)
    assert advice.fits and advice.plan.peak_bytes <= 0.85 * device
    decision = advice.decisions["actor"]
    assert decision.micro_batch_size * decision.grad_accum_steps == 32  # 64 prompts × 4 ÷ 8 ranks
    larger = 2 * decision.micro_batch_size
    if larger <= 32:  # the next candidate would have broken the headroom
        assert decision.measured[larger] > 0.85 * device
    assert decision.micro_batch_size > 1  # an H200 holds more than the configured 1 sequence per micro-batch
    assert f"actor.ppo_micro_batch_size_per_gpu={decision.micro_batch_size}" in advice.overrides


def test_a_job_that_cannot_fit_says_so():
    config = big_job("trainer.n_gpus_per_node=1", "actor.ppo_mini_batch_size=2", "data.train_batch_size=2",
                     "data.max_prompt_length=32768", "data.max_response_length=32768")
    advice = recommend(config, Shapes(QWEN_7B), gpu_spec("a10g").memory_bytes)
    assert not advice.fits and "does not fit" in advice.reason
    assert "actor.fsdp.param_offload=true" in advice.overrides  # every saver was tried


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_forward_flops_match_torch_flop_counter(architecture):
    spec = TinyModelSpec(architecture=architecture, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=320)
    model = build_tiny_model(spec, 2048, pad_token_id=0, eos_token_id=1)
    model.set_attn_implementation("eager")  # attention as plain matmuls, which the counter sees
    shape = DecoderShape.from_hf_config(model.config)
    tokens = 48
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, 2048, (1, tokens)))
    eager_attention = 4 * shape.num_layers * shape.q_width * tokens ** 2  # QKᵀ and AV over the full T × T
    assert counter.get_total_flops() == 2 * matmul_parameters(shape) * tokens + eager_attention
    # eager computes the masked upper triangle too; the model counts the causal half a fused kernel does
    assert forward_flops(shape, tokens) == 2 * matmul_parameters(shape) * tokens + eager_attention // 2


def test_roofline_update_time_by_hand():
    config = big_job()
    gpu = gpu_spec("h100")
    step = roofline_step_time(config, QWEN_7B, gpu, efficiency=0.5)
    expected = 3 * 256 * 4 * forward_flops(QWEN_7B, 2048) / (8 * gpu.bf16_flops) / 0.5
    assert step.phases["update_actor"] == pytest.approx(expected)
    fp8 = roofline_step_time(big_job("model.fp8_compute=true"), QWEN_7B, gpu, efficiency=0.5)
    # the update's matmuls at Hopper's fp8 peak (about twice bf16)
    assert fp8.phases["update_actor"] == pytest.approx(expected * gpu.bf16_flops / gpu.fp8_flops)
    assert step.total == pytest.approx(sum(step.phases.values()))


def test_cost_is_price_times_devices_times_hours():
    job = plan_job(big_job("trainer.total_training_steps=10"), gpu_spec("a100-80"), shapes=Shapes(QWEN_7B),
                   price_per_gpu_hour=2.0)
    assert job.hours == pytest.approx(job.step_time.total * 10 / 3600)
    assert job.cost == pytest.approx(2.0 * 8 * job.hours)


def test_plan_command(tmp_path, capsys):
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True).save_pretrained(tmp_path)
    common = ["plan", "--no-check-paths", f"model.path={tmp_path}", "data.max_prompt_length=512",
              "data.max_response_length=512", "trainer.total_training_steps=100", "model.dtype=bfloat16"]
    assert main(common + ["--gpu", "a10g", "--price-per-gpu-hour", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "A10G" in out and "recommendation: fits" in out and "cost at $1.00/GPU-hour" in out
    assert "fp8 compute: not on A10G" in out
    assert main(common + ["data.max_response_length=65536", "data.max_prompt_length=65536", "--gpu", "a10g"]) == 1
    assert "does not fit" in capsys.readouterr().out


def test_known_model_names_plan_without_weights_and_match_their_published_configs(tmp_path):
    from transformers import Qwen2Config

    from hybridrl.planner.known_models import KNOWN_SHAPES, model_shape

    Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True).save_pretrained(tmp_path)
    assert model_shape(str(tmp_path), "model.path") == KNOWN_SHAPES["qwen2.5-0.5b"]   # table == the real config
    assert model_shape("models/Qwen2.5-7B-Instruct", "model.path") == QWEN_7B
    assert model_shape(None, "critic.model_path") is None


def test_plan_command_refuses_an_unknown_missing_model_without_downloading(capsys):
    assert main(["plan", "--no-check-paths", "model.path=/nowhere/my-private-model"]) == 2
    err = capsys.readouterr().err
    assert "model.path" in err and "/nowhere/my-private-model" in err and "config.json" in err
    assert "Traceback" not in err


def test_micro_batch_grad_sync_holds_only_the_gradient_shard():
    shapes, device = Shapes(QWEN_7B), gpu_spec("a100-80").memory_bytes
    step = plan_memory(big_job(), shapes, device)
    each = plan_memory(big_job("actor.fsdp.grad_sync=micro_batch"), shapes, device)
    total = QWEN_7B.num_parameters()
    per_rank = -(-total // 8)
    in_flight = 4 * (QWEN_7B.root_parameters() + QWEN_7B.layer_parameters())  # unsharded until their reduce-scatter
    assert step.roles["actor"].gradients == 4 * total  # the whole model's fp32 gradients between micro-batches
    assert each.roles["actor"].gradients == 4 * per_rank + in_flight
    assert step.phases["update_actor"] - each.phases["update_actor"] == 4 * total - 4 * per_rank - in_flight
    # gradients exist only in the update: generation and the log-prob forwards are unchanged
    assert step.phases["generate"] == each.phases["generate"]
    assert step.phases["log_probs"] == each.phases["log_probs"]
    assert "unsharded" in step.roles["actor"].note and not each.roles["actor"].note


def test_recommender_tries_micro_batch_grad_sync_first_within_a_node():
    from hybridrl.planner.recommendation import saver_ladder

    device = gpu_spec("a100-80").memory_bytes
    one_node = recommend(big_job("algorithm=gae"), Shapes(QWEN_7B), device)
    assert one_node.fits
    assert one_node.overrides[:2] == ["actor.fsdp.grad_sync=micro_batch", "critic.fsdp.grad_sync=micro_batch"]
    # across nodes the reduce-scatters cross the slower network: checkpointing is tried first, and is enough here
    two_nodes = recommend(big_job("algorithm=gae", "trainer.n_gpus_per_node=4", "trainer.nnodes=2"), Shapes(QWEN_7B),
                          device)
    assert two_nodes.fits and two_nodes.overrides[0] == "model.enable_gradient_checkpointing=true"
    assert not any("grad_sync" in override for override in two_nodes.overrides)
    no_critic = recommend(big_job(), Shapes(QWEN_7B), gpu_spec("a100-40").memory_bytes)
    assert no_critic.overrides[0] == "actor.fsdp.grad_sync=micro_batch"
    assert not any(override.startswith("critic.") for override in no_critic.overrides)
    assert "grad_sync" not in saver_ladder(big_job("trainer.n_gpus_per_node=1", "actor.ppo_mini_batch_size=8",
                                                   "data.train_batch_size=8"))  # one rank: nothing is sharded


@pytest.mark.parametrize(("config_name", "gpu"), [("ppo_qwen2.5_7b_8xa100", "a100-80"),
                                                  ("grpo_qwen2.5_0.5b_a10g", "a10g"),
                                                  ("ppo_qwen2.5_7b_2x2_a10g", "a10g")])
def test_recipes_fit_their_gpus_with_10_to_20_percent_headroom(config_name, gpu):
    """The shipped GPU recipes as configured (shapes by model name; no weights needed)."""
    from hybridrl.planner.search import configured

    job = plan_job(load_config(config_name=config_name, check_paths=False), gpu_spec(gpu))
    plan = job.as_configured
    assert plan.fits(0.15) and job.recommendation.fits
    as_given = configured(job.candidates)  # the recipe's own layout and savers are among the setups that fit...
    assert as_given is not None and job.candidates[0].seconds <= as_given.seconds  # ...and none is preferred slower
    assert 0.80 <= plan.peak_bytes / plan.device_bytes <= 0.90  # and the GPU is not left idle either


def test_the_7b_recipe_fits_because_of_micro_batch_grad_sync():
    config = load_config(["actor.fsdp.grad_sync=step", "critic.fsdp.grad_sync=step"],
                         config_name="ppo_qwen2.5_7b_8xa100", check_paths=False)
    assert not plan_job(config, gpu_spec("a100-80")).as_configured.fits(0.15)


def test_gather_once_auto_stays_off_on_several_gpus():
    """``fsdp.gather_once=auto`` on 8 GPUs plans as ``false``: the root and two layers gathered at a time, not the
    whole bf16 model. (One GPU resolves it on — ``sizing_options`` checks that — but one rank's estimate counts no
    gathered copy either way.)"""
    def actor(*overrides):
        return plan_memory(big_job(*overrides), Shapes(QWEN_7B), gpu_spec("h100").memory_bytes).roles["actor"]

    assert actor() == actor("actor.fsdp.gather_once=false") != actor("actor.fsdp.gather_once=true")
    assert actor("actor.fsdp.gather_once=true").buffers == 2 * QWEN_7B.num_parameters()


def test_one_gpu_short_of_memory_is_advised_to_gather_per_layer():
    """On one GPU ``gather_once=auto`` keeps the whole bf16 model gathered; when that is what does not fit (the A10G
    recipe at its former 7 × 1024-token budget: 87 % with 15 % headroom wanted, checkpointing already on), turning it
    off is the rung before 8-bit optimizer states."""
    config = load_config(config_name="grpo_qwen2.5_0.5b_a10g", overrides=["actor.ppo_max_token_len_per_gpu=7168"],
                         check_paths=False)
    job = plan_job(config, gpu_spec("a10g"))
    assert not job.as_configured.fits(0.15)
    assert job.recommendation.fits
    # the recipe's savers (checkpointing, optimizer offload) with per-layer gathering added is a setup that fits
    per_layer_gathers = [candidate for candidate in job.candidates
                         if set(candidate.savers) == {"checkpointing", "actor_optimizer_offload", "gather_once"}]
    assert per_layer_gathers and per_layer_gathers[0].overrides == ["actor.fsdp.gather_once=false"]
    from hybridrl.planner.known_models import KNOWN_SHAPES

    shape = KNOWN_SHAPES["qwen2.5-0.5b"]
    assert job.as_configured.roles["actor"].buffers == 2 * shape.num_parameters()  # the whole model in bf16
    per_layer = per_layer_gathers[0].memory.roles["actor"].buffers
    assert per_layer == 2 * (shape.root_parameters() + 2 * shape.layer_parameters())  # root and 2 layers in flight
    # what turning it off saves: 0.61 GiB, against the 0.67 GiB the H200 measured for the same switch
    assert 0.55 < (2 * shape.num_parameters() - per_layer) / 2**30 < 0.7


def test_a_distillation_teacher_is_held_like_the_reference_and_its_forward_can_be_the_peak():
    """``algorithm.distillation.teacher_path``: a frozen role of the teacher's own shape, sharded over the actor's
    ranks, resident in every phase; a teacher larger than the student sets the log-prob phase's forward peak."""
    import dataclasses

    student = dataclasses.replace(QWEN_7B, num_layers=24, hidden_size=896, intermediate_size=4864, num_heads=14,
                                  num_kv_heads=2, head_dim=64)  # Qwen2.5-0.5B's shape
    plain = plan_memory(big_job(), Shapes(student), gpu_spec("a100-80").memory_bytes)
    taught = plan_memory(big_job("algorithm.distillation.teacher_path=/nonexistent/teacher"),
                         Shapes(student, teacher=QWEN_7B), plain.device_bytes)
    teacher = taught.roles["teacher"]
    assert teacher.parameters == 4 * -(-QWEN_7B.num_parameters() // 8) and teacher.gradients == teacher.optimizer == 0
    assert taught.phases["update_actor"] - plain.phases["update_actor"] == teacher.resident
    assert taught.phases["log_probs"] - plain.phases["log_probs"] > teacher.resident  # the 7B's forward is the peak


def test_sequence_parallelism_fits_long_responses_that_do_not_fit_whole():
    """32k-token responses of a 7B model on 80 GB: whole sequences overflow, split over 2 ranks they fit. The split
    halves the layers' activations and the logits (each rank scores its share of the rows); the mask-free flash
    layout keeps nothing whole but what follows the layers."""
    def plan(sp):
        config = big_job("data.max_response_length=32768", "data.train_batch_size=16", "actor.ppo_mini_batch_size=16",
                         "actor.ppo_micro_batch_size_per_gpu=1", "model.enable_gradient_checkpointing=true",
                         "model.use_remove_padding=true", "model.attn_implementation=flash_attention_2",
                         f"actor.ulysses_sequence_parallel_size={sp}")
        return config, plan_memory(config, Shapes(QWEN_7B), gpu_spec("h100").memory_bytes)

    (whole_config, whole), (split_config, split) = plan(1), plan(2)
    assert not whole.fits(0.1) and split.fits(0.1)
    assert split.roles["actor"].activations == pytest.approx(whole.roles["actor"].activations / 2, rel=0.05)
    assert split.roles["actor"].parameters == whole.roles["actor"].parameters  # FSDP2 still shards over all 8
    # 8 ranks in groups of 2 are 4 data-parallel ranks: each group's mini-batch holds twice the rows
    assert role_plan(split_config, "actor").local_mini_batch_sequences == \
        2 * role_plan(whole_config, "actor").local_mini_batch_sequences == 2 * 16 * 4 // 8


def test_plan_resolves_an_auto_dtype_for_the_gpu_not_for_this_machine(monkeypatch):
    """A laptop without native bf16 resolves ``model.dtype: auto`` to fp32 for its own runs; a plan is for a GPU,
    which computes in bf16 (the 7B reference job was planned at twice its weights)."""
    from hybridrl.config import load_config
    from hybridrl.planner.hardware import planned_dtype_overrides

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # this machine, as one without native bf16
    overrides = ["model.path=qwen2.5-7b"]
    assert load_config(overrides, check_paths=False).model.dtype == "float32"
    planned = planned_dtype_overrides(overrides, "ppo_trainer")
    assert load_config(planned, check_paths=False).model.dtype == "bfloat16"
    explicit = planned_dtype_overrides([*overrides, "model.dtype=float32"], "ppo_trainer")
    assert load_config(explicit, check_paths=False).model.dtype == "float32"  # what the user chose stays


def test_a_layout_whose_kv_cache_holds_no_sequence_says_it_cannot_generate():
    """7B's weights take the vLLM share of an A10G whole: no KV cache is left, so there is no generate time to give
    (it printed 17,035,960 s)."""
    from hybridrl.planner.report import time_lines
    from hybridrl.planner.time_plan import generation_waves

    config = big_job("rollout=vllm", "rollout.gpu_memory_utilization=0.5", "model.dtype=bfloat16")
    assert generation_waves(config, QWEN_7B, plan_memory(config, Shapes(QWEN_7B), gpu_spec("a10g").memory_bytes)) \
        == float("inf")
    step = roofline_step_time(config, QWEN_7B, gpu_spec("a10g"), waves=float("inf"))
    assert step.phases["generate"] == float("inf") and step.phases["update_actor"] < float("inf")
    job = dataclasses.replace(plan_job(config, gpu_spec("a10g"), shapes=Shapes(QWEN_7B)), step_time=step)
    text = "\n".join(time_lines(job))
    assert "generate impossible" in text and "step cannot run" in text and "cannot generate" in text

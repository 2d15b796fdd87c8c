"""Ulysses sequence parallelism (``hybridrl.modeling.ulysses``): ranks that split every sequence between them train
exactly as one rank holding whole sequences, and hold what the memory model says they hold.

SP = 2 on 2 gloo ranks (and SP = 2 × DP = 2 on 4), FSDP2 over all ranks, through the training engine with micro-batches:
the actor's PPO loss (entropy bonus, KL loss) and the critic's value loss, padded and packed rows, with and without
activation checkpointing — every gradient compared with the plain single-process reference of
``test_grad_accum_invariance`` (relative error ≤ 1e-5: only the order of fp32 sums differs). Each case also checks that
the split really ran (attention saw half the positions) and that a forward with a KV cache (generation) is not split.

Memory: what autograd saves on each rank of a split and the peak of a forward + backward (``SavedTensorBytes``,
``LiveTensorPeak``) against the analytic model the planner uses (``ForwardLayout.split``); and a long row that does
not fit a per-device budget whole but fits split in two, as the model predicts.
"""

from __future__ import annotations

import pytest
import torch
from gloo_spawn import run_on_gloo
from test_grad_accum_invariance import (BATCH, OPTIM, PROMPT, RESPONSE, loss_for, models_and_data,
                                        reference_gradients, relative_error)
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM

from hybridrl.autotune.decoder_shape import DecoderShape
from hybridrl.autotune.memory_sizing import ForwardLayout, LiveTensorPeak, SavedTensorBytes, activation_bytes
from hybridrl.config.schema import ModelConfig
from hybridrl.modeling.attention import attention_implementation
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.engines.optim import build_optimizer
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.ulysses import check_heads, install_ulysses, sequence_parallel_layout
from hybridrl.planner.comm_plan import LINKS, Topology, sequence_parallel_collectives
from hybridrl.utils.collectives import CollectiveCounter
from hybridrl.protocol import Batch
from hybridrl.utils.distributed import full_tensor
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model, save_tiny_model

pytestmark = pytest.mark.distributed

# (role, loss_agg_mode, layout, activation checkpointing)
CASES = [("actor", "token-mean", "padded", False), ("actor", "seq-mean-token-mean", "packed", False),
         ("actor", "seq-mean-token-sum", "padded+fused", False),
         ("actor", "token-mean", "packed", True), ("critic", "token-mean", "padded", False),
         ("critic", "seq-mean-token-sum", "packed", True)]
WIDE_CASES = [("actor", "token-mean", "packed", False), ("critic", "token-mean", "padded", True)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ulysses")
    # 4 query heads over 2 KV heads: SP = 2 splits both; the default tiny model's single KV head is repeated (below)
    actor_dir, critic_dir, data = models_and_data(
        root, save_tiny_model(root / "actor", TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2)))
    return {"actor": actor_dir, "critic": critic_dir}, data


def run_cases(rank, world, sp_size, dirs, data, cases, out_path):
    layout = sequence_parallel_layout(sp_size)
    rows = BATCH // layout.dp_size
    batch = Batch(tensors={name: tensor[layout.dp_rank * rows:(layout.dp_rank + 1) * rows]
                           for name, tensor in data.items()})
    results = {}
    for case in cases:
        role, mode, layout_name, checkpointing = case
        config = ModelConfig(path=str(dirs[role]), dtype="float32", enable_gradient_checkpointing=checkpointing)
        model = build_model(config, role)
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions())
        install_ulysses(model, layout.sp)
        model.train()
        lengths, row_lengths = [], []  # what attention saw; the rows' lengths as the model was called
        model.model.register_forward_pre_hook(
            lambda module, args, kwargs: row_lengths.append((args[0] if args else kwargs["input_ids"]).shape[1]),
            with_kwargs=True,
            prepend=True)
        model.model.layers[0].self_attn.register_forward_hook(
            lambda module, args, kwargs, output: lengths.append(kwargs["hidden_states"].shape[1]), with_kwargs=True)
        engine = TrainingEngine(model, dp=DataParallelGroup(layout.dp_group, layout.dp_rank, layout.dp_size),
                                micro_batching=MicroBatching(micro_batch_size=2),
                                optimizer=build_optimizer(model, OPTIM))
        engine.accumulate_gradients(batch, loss_for(role, mode, layout_name))
        split = (sorted(set(row_lengths)), sorted(set(lengths)))  # checkpointing reruns layers, not the model
        lengths.clear()
        model.eval()
        with torch.no_grad():  # a cached forward (generation) runs whole rows
            model(input_ids=batch["input_ids"][:2], use_cache=True)
        results[case] = dict(gradients={name: full_tensor(param.grad) for name, param in model.named_parameters()},
                             split=split, cached_lengths=list(lengths))
    if rank == 0:
        torch.save(results, out_path)


def run_and_check(setup, tmp_path, world, sp_size, cases):
    dirs, data = setup
    out = tmp_path / "results.pt"
    run_on_gloo(world, run_cases, sp_size, dirs, data, cases, out)
    results = torch.load(out, weights_only=False)
    for case in cases:
        role, mode, layout, _ = case
        _, reference = reference_gradients(role, dirs[role], data, mode)
        result = results[case]
        assert relative_error(result["gradients"], reference) <= 1e-5, case
        # each forward's attention saw half of its rows' positions (rounded up: the rows are padded to an even length)
        rows, seen = result["split"]
        assert seen == sorted({-(-row // sp_size) for row in rows}), (case, result["split"])
        assert result["cached_lengths"] == [PROMPT + RESPONSE], case


def test_sequence_parallel_gradients_equal_whole_sequences(setup, tmp_path):
    run_and_check(setup, tmp_path, world=2, sp_size=2, cases=CASES)


@pytest.mark.long
def test_sequence_parallel_times_data_parallel(setup, tmp_path):
    run_and_check(setup, tmp_path, world=4, sp_size=2, cases=WIDE_CASES)


def test_a_single_kv_head_is_repeated_for_the_split(tmp_path):
    """The default tiny model (2 heads over 1 KV head): SP = 2 repeats the KV head so each rank has one."""
    model_dir = save_tiny_model(tmp_path / "model")
    run_on_gloo(2, _single_kv_head_case, model_dir)


def _single_kv_head_case(rank, world, model_dir):
    layout = sequence_parallel_layout(2)
    reference = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
    model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
    install_ulysses(model, layout.sp)
    ids = torch.randint(4, 60, (2, 9), generator=torch.Generator().manual_seed(3))
    expected = reference(input_ids=ids, use_cache=False).logits
    got = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_heads_not_divisible_is_refused(tmp_path):
    config = AutoModelForCausalLM.from_pretrained(save_tiny_model(tmp_path / "model")).config  # 2 heads
    check_heads(config, 2)
    with pytest.raises(ValueError, match=r"ulysses_sequence_parallel_size=3 must divide the model's 2 attention"):
        check_heads(config, 3)


# ------------------------------------------------------------------------------------------------ memory
# name: (attention, dtype, checkpointing, rows, length, response, padded, packed)
MEMORY_CASES = {
    "sdpa-padded": ("sdpa", torch.float32, False, 4, 64, 32, True, False),
    "sdpa-unpadded": ("sdpa", torch.float32, False, 4, 64, 32, False, False),
    "sdpa-packed": ("sdpa", torch.float32, False, 4, 64, 32, False, True),
    "checkpointing": ("sdpa", torch.float32, True, 8, 128, 64, True, False),
    "cpu-kernel-bf16": ("auto", torch.bfloat16, False, 4, 128, 64, False, False),
}
SAVED_TOLERANCE, PEAK_TOLERANCE = 0.01, 0.10  # as the memory model's own tests (tests/unit/workers)


def memory_model(attention, dtype, checkpointing, vocab=2048, num_layers=2):
    spec = TinyModelSpec(hidden_size=128, num_layers=num_layers, num_heads=4, num_kv_heads=2, intermediate_size=320)
    model = build_tiny_model(spec, vocab, pad_token_id=0, eos_token_id=1).to(dtype)
    model.set_attn_implementation(attention_implementation(attention, "cpu"))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def memory_batch(rows, length, padded, vocab):
    input_ids = torch.randint(4, vocab, (rows, length), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    if padded:
        attention_mask[0, 0] = 0  # one pad token: an explicit mask
    return input_ids, attention_mask


def planned(model, case, sp_size, attention_mask):
    attention, dtype, checkpointing, rows, length, response, padded, packed = case
    kernel = attention_implementation(attention, "cpu")
    layout = (ForwardLayout.packed(int(attention_mask.sum()), rows * response, attention=kernel) if packed
              else ForwardLayout.padded(rows, length, response, masked=padded, attention=kernel)).split(sp_size)
    compute = 2 if dtype == torch.bfloat16 else 4
    estimate = activation_bytes(DecoderShape.from_hf_config(model.config), layout, compute_bytes=compute,
                                logits_bytes=compute, checkpointing=checkpointing)
    # the log-prob function also saves its [M, V] logits: on a split, this rank's share of the rows
    return estimate, estimate.saved + layout.head_share().num_loss_tokens * model.config.vocab_size * compute


def measure(model, case, sp_size, sp):
    attention, dtype, checkpointing, rows, length, response, padded, packed = case
    if sp_size > 1:
        install_ulysses(model, sp)
    input_ids, attention_mask = memory_batch(rows, length, padded, model.config.vocab_size)
    with SavedTensorBytes(model) as saved:
        response_log_probs(model, input_ids, attention_mask, response, packed=packed)
    for param in model.parameters():  # steady state of accumulation: gradients already allocated
        param.grad = torch.zeros_like(param)
    with LiveTensorPeak() as tracker:
        log_probs, _ = response_log_probs(model, input_ids, attention_mask, response, packed=packed)
        (-log_probs.sum() / log_probs.numel()).backward()
    return saved.bytes, tracker.peak_bytes, attention_mask


def _memory_cases(rank, world, out_path):
    sp = sequence_parallel_layout(2).sp
    results = {}
    for name, case in MEMORY_CASES.items():
        for sp_size in (1, 2):
            model = memory_model(*case[:3])
            saved, peak, attention_mask = measure(model, case, sp_size, sp)
            estimate, predicted_saved = planned(model, case, sp_size, attention_mask)
            results[name, sp_size] = dict(saved=saved, peak=peak, predicted_saved=predicted_saved,
                                          predicted_peak=estimate.peak)
    if rank == 0:
        torch.save(results, out_path)


def test_split_activation_memory_is_what_the_model_counts(tmp_path):
    run_on_gloo(2, _memory_cases, tmp_path / "memory.pt")
    results = torch.load(tmp_path / "memory.pt")
    for (name, sp_size), got in results.items():
        assert got["saved"] == pytest.approx(got["predicted_saved"], rel=SAVED_TOLERANCE), (name, sp_size)
        assert got["peak"] == pytest.approx(got["predicted_peak"], rel=PEAK_TOLERANCE), (name, sp_size)
    for name in MEMORY_CASES:  # split in two, each rank holds well under what one whole-sequence rank holds
        assert results[name, 2]["peak"] < 0.75 * results[name, 1]["peak"], name


LONG_ROW = ("sdpa", torch.float32, False, 1, 1024, 512, False, False)


def _long_row(rank, world, out_path):
    sp = sequence_parallel_layout(2).sp
    results = {}
    for sp_size in (1, 2):
        model = memory_model(*LONG_ROW[:3], vocab=4096, num_layers=4)
        _, peak, attention_mask = measure(model, LONG_ROW, sp_size, sp)
        results[sp_size] = (peak, planned(model, LONG_ROW, sp_size, attention_mask)[0].peak)
    if rank == 0:
        torch.save(results, out_path)


def test_a_long_row_fits_a_budget_only_split(tmp_path):
    """A budget set 10 % above the model's peak for the split row: the model says the whole row does not fit and the
    split one does, and the measured peaks say the same."""
    run_on_gloo(2, _long_row, tmp_path / "long.pt")
    results = torch.load(tmp_path / "long.pt")
    budget = 1.1 * results[2][1]
    assert results[1][1] > budget and results[1][0] > budget  # whole: planned and measured over the budget
    assert results[2][0] <= budget  # split: measured within it


def _exchanged_bytes(rank, world, out_path):
    sp = sequence_parallel_layout(2).sp
    results = {}
    for checkpointing in (False, True):
        model = memory_model("sdpa", torch.float32, checkpointing)
        install_ulysses(model, sp)
        input_ids = torch.randint(4, 2048, (2, 11), generator=torch.Generator().manual_seed(0))
        with CollectiveCounter() as counter:
            log_probs, _ = response_log_probs(model, input_ids, torch.ones_like(input_ids), 5)
            log_probs.sum().backward()
        results[checkpointing] = counter.payload_bytes["sequence_parallel"]
    if rank == 0:
        torch.save(results, out_path)


def test_the_planner_counts_the_exchanged_bytes(tmp_path):
    """Two unpadded rows of 11 tokens (padded to 12 for the split), forward and backward, with and without
    checkpointing: the bytes the engine's exchanges move (``comm/sequence_parallel_bytes``) are the planner's
    (``sequence_parallel_collectives``) plus the gather of the 10 scored log-probs (5 a rank, fp32) and its
    backward."""
    run_on_gloo(2, _exchanged_bytes, tmp_path / "bytes.pt")
    measured = torch.load(tmp_path / "bytes.pt")
    shape = DecoderShape.from_hf_config(memory_model("sdpa", torch.float32, False).config)
    topology = Topology(1, 2, LINKS["pcie"], LINKS["1gbe"])
    head_rows = 2 * (5 * 2 * 4)  # the log-probs' gather and its all-reduce: 2 ranks × 5 rows × fp32
    for checkpointing, got in measured.items():
        planned = sequence_parallel_collectives("update_actor", shape, rows=2, length=11, sp=2, forwards=1,
                                                backwards=1, checkpointing=checkpointing, compute_bytes=4,
                                                topology=topology)
        assert got == sum(c.total_bytes for c in planned) + head_rows, checkpointing
    assert measured[True] > measured[False] > 0


def _kernel_names(rank, world, model_dir, out_path):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    seen = []

    def recording_kernel(module, *args, **kwargs):
        seen.append(module.config._attn_implementation)
        return sdpa_attention_forward(module, *args, **kwargs)

    AttentionInterface.register("recording_kernel", recording_kernel)
    ALL_MASK_ATTENTION_FUNCTIONS.register("recording_kernel", sdpa_mask)
    model = build_model(ModelConfig(path=str(model_dir), dtype="float32", attn_implementation="recording_kernel"),
                        "actor")
    install_ulysses(model, sequence_parallel_layout(2).sp)
    ids = torch.randint(4, 60, (2, 9), generator=torch.Generator().manual_seed(3))
    model(input_ids=ids, use_cache=False)  # split
    model(input_ids=ids, use_cache=True)  # generation: whole
    if rank == 0:
        torch.save((seen, model.config._attn_implementation), out_path)


def test_the_inner_kernel_sees_its_own_name(tmp_path):
    """flash-attn's wrapper loads its kernel by the config's attention name: the kernel under the all-to-alls (and on
    a cached call) must see its own name, not ``hybridrl_ulysses:…``."""
    run_on_gloo(2, _kernel_names, save_tiny_model(tmp_path / "model"), tmp_path / "names.pt")
    seen, outer = torch.load(tmp_path / "names.pt")
    assert outer == "hybridrl_ulysses:recording_kernel"
    assert len(seen) == 4 and set(seen) == {"recording_kernel"}  # 2 layers × (split + cached)

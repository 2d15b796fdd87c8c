"""Micro-batch sizing: the analytic memory model against real measurements on tiny Hugging Face models, and the
selection rule against a fake measure function (the rule is the unit under test there, so faking its input is fair).

Measurements are real: ``SavedTensorBytes`` counts what autograd saves (the activation term, which the analytic model
predicts to within 1 %), ``LiveTensorPeak`` follows every tensor storage created in forward and backward (the peak,
predicted to within 10 %).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.modeling.attention import attention_implementation
from hybridrl.autotune.memory_sizing import (
    DecoderShape,
    ForwardLayout,
    LiveTensorPeak,
    Precision,
    SavedTensorBytes,
    activation_bytes,
    analytic_measure_fn,
    choose_micro_batch_size,
    estimate_micro_batch_bytes,
    model_state_bytes,
    probe_peak_bytes,
)
from hybridrl.modeling.sequences import response_log_probs

SAVED_TOLERANCE = 0.01  # what autograd saves: the per-op derivation is exact up to a few small tensors
PEAK_TOLERANCE = 0.10  # the peak: transient temporaries are modelled per step, not traced op by op
VOCAB = 2048  # large enough that the logits terms matter, as they do at a real 150k vocabulary


def tiny(architecture="llama", *, num_layers=2, vocab=VOCAB, dtype=torch.float32, checkpointing=False,
         attention="sdpa"):
    spec = TinyModelSpec(architecture=architecture, hidden_size=128, num_layers=num_layers, num_heads=4,
                         num_kv_heads=2, intermediate_size=320)
    model = build_tiny_model(spec, vocab, pad_token_id=0, eos_token_id=1).to(dtype)
    model.set_attn_implementation(attention_implementation(attention, "cpu"))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def batch(rows, length, *, padded, vocab=VOCAB):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, vocab, (rows, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if padded:
        attention_mask[0, 0] = 0  # one pad token: transformers then passes an explicit mask to sdpa
    return input_ids, attention_mask


CASES = {  # name: (model options, rows, length, response, padded, packed)
    "fp32-padded": (dict(), 4, 64, 32, True, False),
    "fp32-unpadded": (dict(), 4, 64, 32, False, False),
    "fp32-packed": (dict(), 4, 64, 32, False, True),
    "bf16-padded": (dict(dtype=torch.bfloat16), 4, 64, 32, True, False),
    "qwen2-padded": (dict(architecture="qwen2"), 4, 64, 32, True, False),
    "checkpointing": (dict(checkpointing=True), 4, 64, 32, True, False),
    "checkpointing-4-layers": (dict(checkpointing=True, num_layers=4, vocab=512), 8, 128, 64, True, False),
    "longer-small-vocab": (dict(vocab=512), 8, 128, 64, True, False),
    # attn_implementation=auto on CPU: rows of ≤ 192 tokens take the direct kernel, which saves the score matrices
    "cpu-kernel-padded": (dict(attention="auto"), 4, 64, 32, True, False),
    "cpu-kernel-unpadded-bf16": (dict(attention="auto", dtype=torch.bfloat16), 4, 128, 64, False, False),
    "cpu-kernel-long-rows-use-sdpa": (dict(attention="auto", vocab=512), 2, 256, 64, True, False),
}


def analytic_and_layout(model, options, rows, length, response, padded, packed, attention_mask):
    attention = attention_implementation(options.get("attention", "sdpa"), "cpu")
    layout = (ForwardLayout.packed(int(attention_mask.sum()), rows * response, attention=attention) if packed
              else ForwardLayout.padded(rows, length, response, masked=padded, attention=attention))
    compute = 2 if options.get("dtype") == torch.bfloat16 else 4
    estimate = activation_bytes(DecoderShape.from_hf_config(model.config), layout, compute_bytes=compute,
                                logits_bytes=compute, checkpointing=options.get("checkpointing", False))
    return estimate, layout, compute


@pytest.mark.parametrize("case", list(CASES))
def test_saved_activations_match_the_analytic_model(case):
    options, rows, length, response, padded, packed = CASES[case]
    model = tiny(**options)
    input_ids, attention_mask = batch(rows, length, padded=padded, vocab=model.config.vocab_size)
    with SavedTensorBytes(model) as saved:
        log_probs, _ = response_log_probs(model, input_ids, attention_mask, response, packed=packed)
    estimate, layout, compute = analytic_and_layout(model, options, rows, length, response, padded, packed,
                                                    attention_mask)
    # The log-prob function also saves the gathered [M, V] response logits (a reference, no copy).
    predicted = estimate.saved + layout.num_loss_tokens * model.config.vocab_size * compute
    assert saved.bytes == pytest.approx(predicted, rel=SAVED_TOLERANCE)
    assert log_probs.requires_grad


@pytest.mark.parametrize("case", list(CASES))
def test_activation_peak_matches_the_analytic_model(case):
    options, rows, length, response, padded, packed = CASES[case]
    model = tiny(**options)
    input_ids, attention_mask = batch(rows, length, padded=padded, vocab=model.config.vocab_size)
    for param in model.parameters():  # steady state of accumulation: gradients already allocated
        param.grad = torch.zeros_like(param)
    with LiveTensorPeak() as tracker:
        log_probs, _ = response_log_probs(model, input_ids, attention_mask, response, packed=packed)
        (-log_probs.sum() / log_probs.numel()).backward()
    estimate, _, _ = analytic_and_layout(model, options, rows, length, response, padded, packed, attention_mask)
    assert tracker.peak_bytes == pytest.approx(estimate.peak, rel=PEAK_TOLERANCE)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_cpu_probe_matches_the_analytic_total(checkpointing):
    model = tiny(checkpointing=checkpointing)
    measured = probe_peak_bytes(model, 4, 64)
    # A single process: fp32 parameters and gradients, no optimizer state yet.
    precision = Precision(optimizer_bytes_per_param=0)
    predicted = estimate_micro_batch_bytes(DecoderShape.from_hf_config(model.config), 4, 64, precision=precision,
                                           checkpointing=checkpointing).total
    assert measured == pytest.approx(predicted, rel=PEAK_TOLERANCE)
    assert all(param.grad is None for param in model.parameters())


@pytest.mark.parametrize("architecture,tied", [("llama", False), ("qwen2", False), ("llama", True)])
def test_parameter_count_is_exact(architecture, tied):
    spec = TinyModelSpec(architecture=architecture, hidden_size=64, num_layers=3, num_heads=2, num_kv_heads=1,
                         intermediate_size=96, tie_word_embeddings=tied)
    model = build_tiny_model(spec, 100, pad_token_id=0, eos_token_id=1)
    assert DecoderShape.from_hf_config(model.config).num_parameters() == sum(p.numel() for p in model.parameters())


def test_live_tensor_peak_by_hand():
    existing = torch.zeros(1 << 20, dtype=torch.uint8)  # allocated before the region: not counted
    with LiveTensorPeak() as tracker:
        first = torch.ones(1 << 20, dtype=torch.uint8)
        view = first[:10]  # a view allocates nothing
        del first, view
        second = torch.ones(2 << 20, dtype=torch.uint8)
        second.add_(1)  # in place: nothing new
        total = existing + 1  # a new 1 MiB
    assert tracker.peak_bytes == 3 << 20
    assert tracker.live_bytes == 3 << 20
    assert second.numel() + total.numel() == 3 << 20


SHAPE_7B = DecoderShape(num_layers=28, hidden_size=3584, intermediate_size=18944, num_heads=28, num_kv_heads=4,
                        head_dim=128, vocab_size=152064, qkv_bias=True)  # Qwen2.5-7B


def test_model_states_by_hand():
    total = SHAPE_7B.num_parameters()
    assert 7.5e9 < total < 7.7e9
    single = model_state_bytes(SHAPE_7B)
    assert (single.parameters, single.gradients, single.optimizer) == (4 * total, 4 * total, 8 * total)
    assert single.gathered == single.accumulated_gradients == 0
    bf16 = Precision(compute_bytes=2)
    sharded = model_state_bytes(SHAPE_7B, world_size=8, precision=bf16, accumulating=True)
    per_rank = -(-total // 8)
    assert sharded.parameters == 4 * per_rank and sharded.optimizer == 8 * per_rank
    root, layer = SHAPE_7B.root_parameters(), SHAPE_7B.layer_parameters()
    assert sharded.gathered == 2 * (root + 2 * layer)  # bf16 root group + current and prefetched layer
    assert sharded.accumulated_gradients == 4 * total  # FSDP2 no-sync keeps the whole unsharded gradient...
    assert sharded.gradients == 0  # ...instead of the sharded one
    syncing = model_state_bytes(SHAPE_7B, world_size=8, precision=bf16, accumulating=False)
    assert syncing.accumulated_gradients == 0 and syncing.gradients == 4 * per_rank
    assert syncing.gathered == 2 * (root + 2 * layer)
    assert syncing.gathered_gradients == 4 * (root + layer)  # the unsharded grads being reduced
    # one rank computing in bf16 still holds FSDP2's cast copies: layers in flight, or the whole model kept gathered
    assert model_state_bytes(SHAPE_7B, precision=bf16).gathered == 2 * (root + 2 * layer)
    assert model_state_bytes(SHAPE_7B, precision=bf16, gather_once=True).gathered == 2 * total
    # fp32 compute on one rank: left out (FSDP2 still gathers into buffers of its own there — a known gap; the plain
    # modules that the measured-allocation tests compare with have none)
    assert model_state_bytes(SHAPE_7B, gather_once=True).gathered == 0


def test_logits_dominate_at_a_real_vocabulary():
    layout = ForwardLayout.padded(1, 4096)
    estimate = activation_bytes(SHAPE_7B, layout, compute_bytes=2, checkpointing=True)
    assert max(estimate.logits_forward, estimate.logits_backward) > estimate.saved
    packed_sdpa = activation_bytes(SHAPE_7B, ForwardLayout.packed(4 * 4096), compute_bytes=2)
    packed_flash = activation_bytes(SHAPE_7B, ForwardLayout.packed(4 * 4096, attention="flash_attention_2"),
                                    compute_bytes=2)
    # sdpa on packed rows saves an [N, N] mask per layer: quadratic in the packed length
    assert packed_sdpa.per_layer - packed_flash.per_layer > 28 * 2 * (4 * 4096) ** 2


# ------------------------------------------------------------------------------------------------ the decision
class FakeMeasure:
    """Bytes = fixed + per_sequence × micro-batch; records which sizes were probed."""

    def __init__(self, fixed=1000.0, per_sequence=100.0, oom_from=None):
        self.fixed, self.per_sequence, self.oom_from, self.calls = fixed, per_sequence, oom_from, []

    def __call__(self, micro_batch_size, seq_len):
        self.calls.append((micro_batch_size, seq_len))
        if self.oom_from is not None and micro_batch_size >= self.oom_from:
            return math.inf
        return self.fixed + self.per_sequence * micro_batch_size


def test_picks_the_largest_fitting_divisor_and_stops_probing(caplog):
    measure = FakeMeasure()
    # usable = 2000 × 0.85 = 1700 → up to 7 sequences fit; powers of two dividing 16: 1, 2, 4, 8, 16
    with caplog.at_level(logging.INFO, logger="hybridrl.autotune.memory_sizing"):
        decision = choose_micro_batch_size(2000, seq_len=512, local_mini_batch_size=16, measure_fn=measure,
                                           world_size=4)
    assert (decision.micro_batch_size, decision.grad_accum_steps) == (4, 4)
    assert decision.predicted_bytes == 1400 and decision.usable_bytes == pytest.approx(1700)
    assert [size for size, _ in measure.calls] == [1, 2, 4, 8]  # 16 never probed
    assert all(seq_len == 512 for _, seq_len in measure.calls)
    assert decision.measured == {1: 1100, 2: 1200, 4: 1400, 8: 1800}
    assert "4 x 4 x 4 = 64 sequences" in decision.reason and "8 would need" in decision.reason
    assert decision.reason in caplog.text


def test_headroom_boundary_and_zero_headroom():
    measure = FakeMeasure(fixed=0, per_sequence=100)
    exact = choose_micro_batch_size(800, seq_len=8, local_mini_batch_size=8, measure_fn=measure, headroom=0.0)
    assert exact.micro_batch_size == 8 and "largest candidate" in exact.reason
    with_headroom = choose_micro_batch_size(800, seq_len=8, local_mini_batch_size=8, measure_fn=measure,
                                            headroom=0.5)
    assert with_headroom.micro_batch_size == 4  # 400 <= 800 × 0.5 exactly


def test_non_divisors_are_skipped_unmeasured():
    measure = FakeMeasure(fixed=0, per_sequence=1)
    decision = choose_micro_batch_size(1e9, seq_len=8, local_mini_batch_size=12, measure_fn=measure,
                                       candidates=[1, 2, 3, 4, 5, 8])
    assert decision.micro_batch_size == 4 and decision.grad_accum_steps == 3
    assert [size for size, _ in measure.calls] == [1, 2, 3, 4]


def test_out_of_memory_counts_as_not_fitting():
    decision = choose_micro_batch_size(1e9, seq_len=8, local_mini_batch_size=8, measure_fn=FakeMeasure(oom_from=4))
    assert decision.micro_batch_size == 2
    assert "out of memory" in decision.reason


@pytest.mark.parametrize("kwargs,match", [
    (dict(budget_bytes=500), "even micro_batch_size=1"),
    (dict(budget_bytes=0), "budget_bytes must be positive"),
    (dict(headroom=1.0), "headroom"),
    (dict(local_mini_batch_size=6, candidates=[4, 5]), "divides the local mini-batch"),
    (dict(candidates=[0, 2]), "positive integers"),
    (dict(local_mini_batch_size=0), "local_mini_batch_size"),
])
def test_refusals(kwargs, match):
    arguments = dict(budget_bytes=1e6, seq_len=8, local_mini_batch_size=8, measure_fn=FakeMeasure())
    arguments.update(kwargs)
    budget = arguments.pop("budget_bytes")
    with pytest.raises(ValueError, match=match):
        choose_micro_batch_size(budget, **arguments)


def test_analytic_sizing_of_a_7b_model_on_80_gb():
    measure = analytic_measure_fn(SHAPE_7B, world_size=8, precision=Precision(compute_bytes=2),
                                  checkpointing=True, accumulating=True)
    decision = choose_micro_batch_size(80 * 2**30, seq_len=4096, local_mini_batch_size=32, measure_fn=measure)
    assert decision.micro_batch_size * decision.grad_accum_steps == 32
    assert 1 <= decision.micro_batch_size < 32  # the logits at a 152k vocabulary bound it well below the mini-batch
    assert decision.predicted_bytes <= 0.85 * 80 * 2**30 < decision.measured[2 * decision.micro_batch_size]

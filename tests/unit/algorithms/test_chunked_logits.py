"""Chunked log-probs and entropy: equal to the naive full-vocab computation, in value and gradient, without
keeping vocab-sized intermediates for backward."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.algorithms import entropy_from_logits, log_probs_from_logits, token_log_probs_and_entropy
from hybridrl.algorithms.logits import log_probs_and_entropy_from_logits

FAST = settings(max_examples=30, deadline=None)


def naive_log_probs(logits, labels):
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def naive_entropy(logits):
    return -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)


def make(seed, shape, vocab, dtype=torch.float32, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, vocab, generator=g) * scale).to(dtype)
    labels = torch.randint(0, vocab, shape, generator=g)
    return logits, labels


@pytest.mark.parametrize("seed,shape,vocab", [(0, (3, 5), 17), (1, (2, 7), 50), (2, (11,), 8), (3, (1, 1), 3)])
@pytest.mark.parametrize("chunk_size", [1, 4, 4096])
def test_fp32_equals_naive(seed, shape, vocab, chunk_size):
    logits, labels = make(seed, shape, vocab)
    assert torch.allclose(log_probs_from_logits(logits, labels, chunk_size), naive_log_probs(logits, labels), atol=1e-5)
    assert torch.allclose(entropy_from_logits(logits, chunk_size), naive_entropy(logits), atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_input_equals_naive(seed):
    logits, labels = make(seed, (4, 6), 64, dtype=torch.bfloat16)
    log_probs = log_probs_from_logits(logits, labels, chunk_size=5)
    entropy = entropy_from_logits(logits, chunk_size=5)
    assert log_probs.dtype == entropy.dtype == torch.float32
    # exact against the naive computation on the same (bf16-valued) numbers in fp32 ...
    assert torch.allclose(log_probs, naive_log_probs(logits.float(), labels), atol=1e-5)
    assert torch.allclose(entropy, naive_entropy(logits.float()), atol=1e-5)
    # ... and within bf16 resolution of the naive computation done in bf16 end to end
    assert torch.allclose(log_probs, naive_log_probs(logits, labels).float(), atol=0.1, rtol=0.02)
    assert torch.allclose(entropy, naive_entropy(logits).float(), atol=0.1, rtol=0.02)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_gradients_equal_naive_autograd(dtype, atol):
    logits, labels = make(4, (3, 4), 20, dtype=dtype)
    weights = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
    ours = logits.clone().requires_grad_()
    ours_total = (log_probs_from_logits(ours, labels, 3) + entropy_from_logits(ours, 3)) * weights
    ours_total.sum().backward()
    naive = logits.float().clone().requires_grad_()
    ((naive_log_probs(naive, labels) + naive_entropy(naive)) * weights).sum().backward()
    assert ours.grad.dtype == dtype
    assert torch.allclose(ours.grad.float(), naive.grad, atol=atol)


def test_gradcheck_fp64_including_non_contiguous_slices():
    logits, labels = make(6, (2, 5), 7, dtype=torch.float64, scale=1.0)
    logits.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: log_probs_from_logits(x, labels, 3), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, 3), (logits,))
    # logits[:, :-1] is the usual "predict the next token" slice: not viewable as [tokens, vocab]
    assert torch.autograd.gradcheck(lambda x: log_probs_from_logits(x[:, :-1], labels[:, 1:], 2), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x[:, :-1], 2), (logits,))
    transposed = logits.detach().transpose(0, 1).requires_grad_()  # an exotic layout still works
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x.transpose(0, 1), 4), (transposed,))


@FAST
@given(vocab=st.integers(1, 300), value=st.floats(-1e4, 1e4), tokens=st.integers(1, 9))
def test_entropy_of_uniform_logits_is_log_vocab(vocab, value, tokens):
    entropy = entropy_from_logits(torch.full((tokens, vocab), value), chunk_size=4)
    assert torch.allclose(entropy, torch.full((tokens,), math.log(vocab)), atol=1e-4)


def test_extreme_logits_stay_finite():
    logits = torch.tensor([[1e4, -1e4, 0.0], [-3e4, 3e4, 3e4]])
    labels = torch.tensor([1, 2])
    log_probs = log_probs_from_logits(logits, labels)
    assert torch.isfinite(log_probs).all() and log_probs[0].item() == pytest.approx(-2e4)
    # fp32 spacing at 3e4 is ~2e-3, so log 2 is only resolved that finely (exactly as by log_softmax)
    assert log_probs[1].item() == pytest.approx(-math.log(2), abs=2e-3)
    assert torch.allclose(log_probs, naive_log_probs(logits, labels))
    entropy = entropy_from_logits(logits)
    assert torch.allclose(entropy, torch.tensor([0.0, math.log(2)]), atol=1e-6)


def _vocab_sized_saved_tensors(fn, logits):
    """Bytes of tensors autograd saves for backward that are vocab-sized but are not the logits themselves."""
    extra = []

    def pack(tensor):
        if tensor.numel() >= logits.numel() // 2 and tensor.data_ptr() != logits.data_ptr():
            extra.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(logits).sum().backward()
    return extra


def test_backward_keeps_no_vocab_sized_intermediates():
    logits, labels = make(7, (4, 32), 256, dtype=torch.bfloat16)
    logits.requires_grad_()
    assert _vocab_sized_saved_tensors(lambda x: log_probs_from_logits(x, labels, 16), logits) == []
    assert _vocab_sized_saved_tensors(lambda x: entropy_from_logits(x, 16), logits) == []
    # the detector does detect the naive version's saved fp32 copy / softmax
    assert _vocab_sized_saved_tensors(lambda x: naive_log_probs(x.float(), labels), logits) != []
    assert _vocab_sized_saved_tensors(lambda x: naive_entropy(x.float()), logits) != []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [3, 4096])
def test_log_probs_with_entropy_are_the_separate_functions_bits(dtype, chunk_size):
    """One log-softmax for both: the same log-probs, log-prob gradient and entropy bits as the two separate calls;
    the entropy is a metric (no gradient)."""
    logits, labels = make(5, (4, 6), 40, dtype)
    logits = logits[:, 1:]  # a non-contiguous slice, chunked within rows
    labels = labels[:, 1:]
    weights = torch.randn(labels.shape, generator=torch.Generator().manual_seed(2))
    separate = logits.detach().requires_grad_()
    (log_probs_from_logits(separate, labels, chunk_size) * weights).sum().backward()
    together = logits.detach().requires_grad_()
    log_probs, entropy = log_probs_and_entropy_from_logits(together, labels, chunk_size)
    (log_probs * weights).sum().backward()
    assert torch.equal(log_probs, log_probs_from_logits(logits, labels, chunk_size))
    assert torch.equal(entropy, entropy_from_logits(logits, chunk_size))
    assert torch.equal(together.grad, separate.grad)
    assert not entropy.requires_grad and entropy.shape == labels.shape


def test_token_log_probs_and_entropy_gives_the_entropy_a_gradient_only_for_a_bonus():
    logits, labels = make(6, (2, 5), 30)
    logits.requires_grad_()
    assert token_log_probs_and_entropy(logits, labels, with_entropy=False, entropy_grad=True)[1] is None
    assert not token_log_probs_and_entropy(logits, labels, with_entropy=True, entropy_grad=False)[1].requires_grad
    log_probs, entropy = token_log_probs_and_entropy(logits, labels, with_entropy=True, entropy_grad=True)
    assert log_probs.requires_grad and entropy.requires_grad
    with torch.no_grad():
        assert not token_log_probs_and_entropy(logits, labels, with_entropy=True, entropy_grad=True)[1].requires_grad


def test_argument_errors():
    logits, labels = make(8, (2, 3), 5)
    with pytest.raises(ValueError, match="labels"):
        log_probs_from_logits(logits, labels[:, :2])
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=0)

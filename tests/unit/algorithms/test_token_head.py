"""The LM head fused with the log-softmax: equal to ``log_softmax(hidden @ W.T / T)`` written out, in value and in
the gradients of the hidden states and the head weight, for any chunking."""

from __future__ import annotations

import pytest
import torch

from hybridrl.algorithms.token_head import head_chunk_tokens, token_log_probs_from_hidden


def make(seed, tokens=13, dim=8, vocab=37, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, dim, generator=g, dtype=torch.float64).to(dtype)
    weight = (torch.randn(vocab, dim, generator=g, dtype=torch.float64) * 0.7).to(dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    return hidden, weight, targets


def reference(hidden, weight, targets, temperature):
    """The plain path in float64: full logits, log-softmax, gather; entropy from the same distribution."""
    log_p = torch.log_softmax((hidden.double() @ weight.double().T) / temperature, dim=-1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("chunk", [1, 4, 13, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_reference_float64(chunk, temperature):
    hidden, weight, targets = make(0)
    coef_lp, coef_h = torch.randn(13, dtype=torch.float64), torch.randn(13, dtype=torch.float64)
    ours_h, ours_w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    log_probs, entropy = token_log_probs_from_hidden(ours_h, ours_w, targets, temperature=temperature, chunk=chunk,
                                                     with_entropy=True)
    ((log_probs * coef_lp).sum() + (entropy * coef_h).sum()).backward()
    ref_h, ref_w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref_lp, ref_ent = reference(ref_h, ref_w, targets, temperature)
    ((ref_lp * coef_lp).sum() + (ref_ent * coef_h).sum()).backward()
    torch.testing.assert_close(log_probs, ref_lp, atol=1e-12, rtol=0)
    torch.testing.assert_close(entropy, ref_ent, atol=1e-12, rtol=0)
    torch.testing.assert_close(ours_h.grad, ref_h.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(ours_w.grad, ref_w.grad, atol=1e-12, rtol=0)


def test_gradcheck_log_probs_and_entropy():
    hidden, weight, targets = make(1, tokens=5, dim=4, vocab=7)
    hidden.requires_grad_(), weight.requires_grad_()

    def both(h, w):
        log_probs, entropy = token_log_probs_from_hidden(h, w, targets, temperature=1.3, chunk=2, with_entropy=True)
        return log_probs, entropy

    assert torch.autograd.gradcheck(both, (hidden, weight))


def test_log_probs_only_has_no_entropy_and_its_gradient_matches():
    hidden, weight, targets = make(2)
    ours = hidden.clone().requires_grad_()
    log_probs, entropy = token_log_probs_from_hidden(ours, weight, targets, chunk=5)
    assert entropy is None
    log_probs.sum().backward()
    ref = hidden.clone().requires_grad_()
    reference(ref, weight, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(ours.grad, ref.grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compute_dtype_follows_the_plain_mixed_precision_path(dtype):
    """The plain path multiplies in the compute dtype, casts the logits to fp32 and takes the log-softmax there;
    gradients re-enter the matmul's backward in the compute dtype."""
    hidden, weight, targets = make(3, tokens=9, dim=16, vocab=50, dtype=dtype)
    ours_h, ours_w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    log_probs, entropy = token_log_probs_from_hidden(ours_h, ours_w, targets, chunk=9, with_entropy=True)
    assert log_probs.dtype == entropy.dtype == torch.float32
    (log_probs.sum() + entropy.sum()).backward()
    plain_h, plain_w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    log_p = torch.log_softmax(torch.nn.functional.linear(plain_h, plain_w).float(), dim=-1)
    plain_lp, plain_ent = log_p.gather(-1, targets[:, None]).squeeze(-1), -(log_p.exp() * log_p).sum(-1)
    (plain_lp.sum() + plain_ent.sum()).backward()
    torch.testing.assert_close(log_probs, plain_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, plain_ent, atol=1e-5, rtol=0)
    grad_tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert ours_h.grad.dtype == ours_w.grad.dtype == dtype
    torch.testing.assert_close(ours_h.grad.float(), plain_h.grad.float(), atol=grad_tol, rtol=grad_tol)
    torch.testing.assert_close(ours_w.grad.float(), plain_w.grad.float(), atol=grad_tol, rtol=grad_tol)


def test_chunk_from_a_byte_budget():
    assert head_chunk_tokens(152_064) == 441 and head_chunk_tokens(49_152) == 1365
    assert head_chunk_tokens(10**9, chunk_bytes=1) == 1


@pytest.mark.parametrize("shapes,message", [
    (((4, 3), (5, 2), (4,)), "hidden \\[M, D\\] and weight \\[V, D\\]"),
    (((4, 3), (5, 3), (3,)), "targets must be \\[M\\]"),
])
def test_shape_errors_name_the_argument(shapes, message):
    (h, w, t) = shapes
    with pytest.raises(ValueError, match=message):
        token_log_probs_from_hidden(torch.zeros(h), torch.zeros(w), torch.zeros(t, dtype=torch.long))

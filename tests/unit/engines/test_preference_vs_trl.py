"""``hybridrl dpo``'s losses against a peer: TRL's own ``DPOTrainer`` (TRL 1.16, its ``compute_loss`` on one batch)
and hybridrl's ``PreferenceOptimizationLoss`` on the same pairs, the same policy and the same reference model give
the same loss and the same gradient, for DPO (TRL's ``sigmoid``) and IPO (TRL's ``ipo``, per-token means); SimPO
against TRL's ``CPOTrainer`` with ``loss_type="simpo"`` and no NLL term (``cpo_alpha=0``).

The pairs are plain text on a character-level tokenizer, so both sides' tokens are the same (checked first); the
policy is the tiny model with its weights perturbed, the reference the tiny model itself, so the implicit rewards
are not zero."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.dpo_schema import DPOLossConfig
from hybridrl.data.preference import PairFields, PreferencePair, encode_pairs
from hybridrl.engines.preference_losses import PreferenceOptimizationLoss, pair_log_probs
from hybridrl.utils.tiny_model import save_tiny_model

trl = pytest.importorskip("trl", reason="needs TRL (pip install 'hybridrl[test]')")

ROWS = [("3+4=", "7", "8"), ("12+9=", "21", "2"), ("5+5=", "10", "100"), ("1+1=", "2", "11"), ("30+3=", "33", "3")]
RESPONSE = 6
BETA, GAMMA = 0.3, 0.2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("vs_trl")
    reference_dir = save_tiny_model(root / "reference")
    policy = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    policy.save_pretrained(root / "policy")
    return root / "policy", reference_dir


def trl_loss_and_gradients(policy_dir, reference_dir, loss_type, output_dir):
    """TRL's ``DPOTrainer`` (``sigmoid``, ``ipo``) or, for ``simpo``, its ``CPOTrainer`` (``loss_type="simpo"``, no
    NLL term): one ``compute_loss`` over all the pairs, and its backward."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_dir)
    common = dict(output_dir=str(output_dir), beta=BETA, per_device_train_batch_size=len(ROWS), report_to=[],
                  use_cpu=True, bf16=False)
    data = Dataset.from_list([dict(zip(("prompt", "chosen", "rejected"), row)) for row in ROWS])
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    if loss_type == "simpo":
        from trl.experimental.cpo import CPOConfig, CPOTrainer

        args = CPOConfig(**common, loss_type="simpo", cpo_alpha=0.0, simpo_gamma=GAMMA, max_length=64,
                         remove_unused_columns=False)
        trainer = CPOTrainer(model=policy, args=args, processing_class=tokenizer, train_dataset=data)
    else:
        args = trl.DPOConfig(**common, loss_type=[loss_type], max_length=None)
        trainer = trl.DPOTrainer(model=policy, args=args, processing_class=tokenizer, train_dataset=data,
                                 ref_model=AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32))
    batch = next(iter(trainer.get_train_dataloader()))  # the whole data set: its order does not matter
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    sides = [("chosen_input_ids", "chosen_attention_mask"), ("rejected_input_ids", "rejected_attention_mask")] \
        if loss_type == "simpo" else [("input_ids", "attention_mask")]
    sequences = {tuple(ids[mask.bool()].tolist()) for ids_key, mask_key in sides
                 for ids, mask in zip(batch[ids_key], batch[mask_key])}
    return float(loss.detach()), {name: p.grad.clone() for name, p in trainer.model.named_parameters()}, sequences


def hybridrl_loss_and_gradients(policy_dir, reference_dir, loss_type):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_dir)
    pairs = encode_pairs(tokenizer, [PreferencePair(*row) for row in ROWS], RESPONSE, apply_chat_template=False)
    reference = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32)
    with torch.no_grad():
        scored = pair_log_probs(reference, pairs, RESPONSE, packed=False)
    pairs[PairFields.REFERENCE_CHOSEN_LOG_PROBS], pairs[PairFields.REFERENCE_REJECTED_LOG_PROBS] = (
        scored.chosen, scored.rejected)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).train()
    loss_config = DPOLossConfig(type={"sigmoid": "dpo", "ipo": "ipo", "simpo": "simpo"}[loss_type], beta=BETA,
                                simpo_gamma=GAMMA)
    loss, _ = PreferenceOptimizationLoss(RESPONSE, loss_config)(policy, pairs, torch.tensor(float(len(ROWS))))
    loss.backward()
    sequences = {tuple(ids[mask.bool()].tolist()) for side in ("chosen", "rejected")
                 for ids, mask in zip(pairs[f"{side}_input_ids"], pairs[f"{side}_attention_mask"])}
    return float(loss.detach()), {name: p.grad.clone() for name, p in policy.named_parameters()}, sequences


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "simpo"])
def test_the_loss_and_its_gradient_equal_trls(models, tmp_path, loss_type):
    policy_dir, reference_dir = models
    theirs, their_gradients, their_sequences = trl_loss_and_gradients(policy_dir, reference_dir, loss_type, tmp_path)
    ours, our_gradients, our_sequences = hybridrl_loss_and_gradients(policy_dir, reference_dir, loss_type)
    assert our_sequences == their_sequences  # the same tokens on both sides
    assert abs(ours - {"sigmoid": 0.6931, "ipo": 1 / (2 * BETA) ** 2}.get(loss_type, 0)) > 1e-3  # not the start
    assert ours == pytest.approx(theirs, rel=1e-6)
    assert sum(float(gradient.norm()) for gradient in their_gradients.values()) > 0
    for name, gradient in our_gradients.items():  # relative error of each parameter's whole gradient
        error = float((gradient - their_gradients[name]).norm() / their_gradients[name].norm().clamp_min(1e-30))
        assert error <= 1e-5, (name, error)


KTO_ROWS = [("3+4=", "7", True), ("12+9=", "2", False), ("5+5=", "10", True), ("1+1=", "11", False),
            ("30+3=", "33", True)]
KTO_WEIGHTS = (1.2, 0.9)


def trl_kto_loss_and_gradients(policy_dir, reference_dir, output_dir):
    """TRL's ``KTOTrainer`` (``loss_type="kto"``): one ``compute_loss`` over all the rows in one batch (its KL
    completions: the completions rotated by one within the batch), and its backward."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_dir)
    args = trl.KTOConfig(output_dir=str(output_dir), beta=BETA, per_device_train_batch_size=len(KTO_ROWS),
                         report_to=[], use_cpu=True, bf16=False, max_length=None, loss_type="kto",
                         desirable_weight=KTO_WEIGHTS[0], undesirable_weight=KTO_WEIGHTS[1])
    data = Dataset.from_list([dict(zip(("prompt", "completion", "label"), row)) for row in KTO_ROWS])
    trainer = trl.KTOTrainer(model=AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32), args=args,
                             processing_class=tokenizer, train_dataset=data,
                             ref_model=AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32))
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["label"].tolist() == [row[2] for row in KTO_ROWS]  # sequential: the rotation is the data order's
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in trainer.model.named_parameters()}


def hybridrl_kto_loss_and_gradients(policy_dir, reference_dir):
    """hybridrl's KTO rows (``kto_pairs``: each row's KL completion the previous row's), the reference's and the
    policy's KL-side log-probs → ``z₀`` as the trainer computes it, then the engine loss on the completion side."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.data.unpaired import LabelledCompletion, kto_pairs
    from hybridrl.trainers.dpo_trainer import reference_point

    tokenizer = AutoTokenizer.from_pretrained(reference_dir)
    rows = kto_pairs([LabelledCompletion(*row) for row in KTO_ROWS])
    batch = encode_pairs(tokenizer, rows, RESPONSE, apply_chat_template=False)
    batch[PairFields.DESIRABLE] = torch.tensor([float(row.desirable) for row in rows])
    batch[PairFields.STEP_LABEL_COUNTS] = torch.tensor([[3.0, 2.0]]).expand(len(rows), 2)
    reference = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).train()
    with torch.no_grad():
        scored = pair_log_probs(reference, batch, RESPONSE, packed=False)
        policy_kl = pair_log_probs(policy, batch, RESPONSE, packed=False).rejected
    batch[PairFields.REFERENCE_CHOSEN_LOG_PROBS], batch[PairFields.REFERENCE_REJECTED_LOG_PROBS] = (
        scored.chosen, scored.rejected)
    batch[PairFields.STEP_KL] = reference_point(policy_kl, batch)
    config = DPOLossConfig(type="kto", beta=BETA, desirable_weight=KTO_WEIGHTS[0], undesirable_weight=KTO_WEIGHTS[1])
    loss, _ = PreferenceOptimizationLoss(RESPONSE, config)(policy, batch, torch.tensor(float(len(rows))))
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in policy.named_parameters()}, float(
        batch[PairFields.STEP_KL][0])


@pytest.mark.parametrize("seed, clamped", [(3, False), (0, True)], ids=["kl-above-0", "kl-clamped-to-0"])
def test_kto_loss_and_gradient_equal_trls(models, tmp_path, seed, clamped):
    """Two policies around the reference: one whose KL estimate is positive (``z₀`` enters the loss as it is),
    one whose estimate is negative (clamped to 0, in TRL as here)."""
    from transformers import AutoModelForCausalLM

    _, reference_dir = models
    policy = AutoModelForCausalLM.from_pretrained(reference_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    policy.save_pretrained(tmp_path / "policy")
    theirs, their_gradients = trl_kto_loss_and_gradients(tmp_path / "policy", reference_dir, tmp_path / "trl")
    ours, our_gradients, z0 = hybridrl_kto_loss_and_gradients(tmp_path / "policy", reference_dir)
    assert (z0 == 0) == clamped
    assert ours == pytest.approx(theirs, rel=1e-6)
    for name, gradient in our_gradients.items():
        error = float((gradient - their_gradients[name]).norm() / their_gradients[name].norm().clamp_min(1e-30))
        assert error <= 1e-5, (name, error)

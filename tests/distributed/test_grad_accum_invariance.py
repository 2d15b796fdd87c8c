"""The invariance tests: one optimizer step's gradient (and update) is the same for every way of cutting the batch.

DP ∈ {1, 2} (real FSDP2 over gloo) × micro-batch ∈ {1, 2, whole, token budget} × {padded, packed, shared prompts} × every
``loss_agg_mode``, for the actor's PPO loss (with entropy bonus and KL loss) and the critic's clipped value loss —
each compared with a plain single-process, single-batch PyTorch reference written out below (relative error ≤ 1e-5).
Gradients reduce once per step (``fsdp.grad_sync=step``); a few optimizer steps also run with ``micro_batch`` (a
reduce-scatter after every micro-batch, counted) and must give the same update.
This is the gradient-accumulation bug peer frameworks shipped; here it is a test.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from hybridrl.config.schema import ActorConfig, CriticConfig, ModelConfig
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.collectives import CollectiveCounter
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward, ValueLoss
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching, split_micro_batches
from hybridrl.utils.distributed import full_tensor
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.config.schema import OptimConfig
from gloo_spawn import run_on_gloo

pytestmark = pytest.mark.distributed

BATCH, PROMPT, RESPONSE = 8, 5, 6
MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MICRO = ("1", "2", "whole", "tokens")
LAYOUTS = ("padded", "packed", "shared")  # shared: padded rows with model.share_prompts (rows come in prompt pairs)
HORIZON = float(RESPONSE)
ACTOR_SETTINGS = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
# Adam's first step is lr * g / (|g| + eps): every component with |g| >> eps moves by a full lr, so a component's
# update carries its gradient's own *relative* rounding error — large for the tiniest gradients — at full weight. With
# the default eps=1e-8 components of ~1e-9 (pure rounding noise) would dominate the comparison; eps=1e-4 scales the
# updates of components below 1e-4 down with their gradients, so the update comparison weighs components as the
# gradient comparison does (gradients themselves are compared exactly, above).
ADAM_EPS = 1e-4
OPTIM = OptimConfig(lr=1e-3, weight_decay=0.01, eps=ADAM_EPS)


def make_data(seed: int = 0) -> dict[str, torch.Tensor]:
    """Ragged prompt+response rows: prompt lengths 1..5 (left pad), response lengths 1..6 (right pad); rows come in
    pairs with one prompt, as GRPO's ``n`` responses do."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 60, (BATCH, PROMPT + RESPONSE), generator=generator)
    input_ids[1::2, :PROMPT] = input_ids[0::2, :PROMPT]
    attention_mask = torch.zeros(BATCH, PROMPT + RESPONSE, dtype=torch.long)
    prompt_lengths = [5, 5, 1, 1, 3, 3, 4, 4]
    response_lengths = [6, 1, 4, 2, 6, 3, 1, 5]
    for row, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        attention_mask[row, PROMPT - p:PROMPT + r] = 1
    input_ids = input_ids * attention_mask
    response_mask = attention_mask[:, PROMPT:].clone()
    noise = lambda: torch.randn(BATCH, RESPONSE, generator=generator)  # noqa: E731
    return dict(input_ids=input_ids, attention_mask=attention_mask, responses=input_ids[:, PROMPT:].clone(),
                response_mask=response_mask, advantages=noise(), values=noise() * 0.5, returns=noise(),
                log_prob_noise=noise() * 0.3, ref_noise=noise() * 0.2)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("accum")
    return models_and_data(root, save_tiny_model(root / "actor"))


def models_and_data(root, actor_dir):
    """``(actor_dir, critic_dir, data)``: a critic with the actor's backbone saved beside it, and :func:`make_data`
    with old and reference log-probs near the actor's own."""
    critic = AutoModelForTokenClassification.from_pretrained(actor_dir, num_labels=1)  # head stored, so loads agree
    critic.save_pretrained(root / "critic")
    data = make_data()
    with torch.no_grad():
        current = reference_log_probs(AutoModelForCausalLM.from_pretrained(actor_dir), data)
    data["old_log_probs"] = (current + data.pop("log_prob_noise")) * data["response_mask"]
    data["ref_log_probs"] = (current + data.pop("ref_noise")) * data["response_mask"]
    return actor_dir, root / "critic", data


# ---------------------------------------------------------------- the plain single-process reference (no hybridrl)
def reference_forward(model, data):
    mask = data["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return model(input_ids=data["input_ids"], attention_mask=mask, position_ids=positions, use_cache=False).logits


def reference_log_probs(model, data, with_entropy=False):
    logits = reference_forward(model, data)[:, PROMPT - 1:-1].float()
    log_softmax = logits.log_softmax(-1)
    log_probs = log_softmax.gather(-1, data["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return (log_probs, entropy) if with_entropy else log_probs


def reference_aggregate(loss, mask, mode):
    mask = mask.float()
    tokens_per_row = mask.sum(-1)
    rows = (tokens_per_row > 0).float()
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    row_sums = (loss * mask).sum(-1)
    if mode == "seq-mean-token-sum":
        return row_sums.sum() / rows.sum()
    if mode == "seq-mean-token-mean":
        return (row_sums / tokens_per_row.clamp_min(1)).sum() / rows.sum()
    return (row_sums / HORIZON).sum() / rows.sum()


def reference_actor_loss(model, data, mode):
    log_probs, entropy = reference_log_probs(model, data, with_entropy=True)
    ratio = torch.exp(log_probs - data["old_log_probs"])
    advantages = data["advantages"]
    clipped = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.28))
    per_token = torch.where(advantages < 0, torch.minimum(clipped, -advantages * 3.0), clipped)
    diff = data["ref_log_probs"] - log_probs  # k3 ("low_var_kl"), clamped as the library does
    kl = (torch.exp(diff) - diff - 1).clamp(-10, 10)
    mask = data["response_mask"]
    return (reference_aggregate(per_token, mask, mode) - 0.01 * reference_aggregate(entropy, mask, mode)
            + 0.1 * reference_aggregate(kl, mask, mode))


def reference_critic_loss(model, data, mode):
    values = reference_forward(model, data)[:, PROMPT - 1:-1, 0].float()
    old, returns = data["values"], data["returns"]
    clipped = old + (values - old).clamp(-0.5, 0.5)
    per_token = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * reference_aggregate(per_token, data["response_mask"], mode)


def reference_gradients(role, model_dir, data, mode):
    model_class = AutoModelForCausalLM if role == "actor" else AutoModelForTokenClassification
    model = model_class.from_pretrained(model_dir, dtype=torch.float32)
    loss = (reference_actor_loss if role == "actor" else reference_critic_loss)(model, data, mode)
    loss.backward()
    return model, {name: param.grad.clone() for name, param in model.named_parameters()}


# ---------------------------------------------------------------- hybridrl on N gloo ranks
def engine_for(role, model_dir, rank, world, micro_batching, keep_gathered=False):
    from torch.distributed.device_mesh import init_device_mesh

    model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor" if role == "actor" else "critic")
    shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions(keep_gathered=keep_gathered))
    optimizer = build_optimizer(model, OPTIM)
    scheduler = build_scheduler(optimizer, OPTIM, total_steps=10)
    return TrainingEngine(model, dp=DataParallelGroup(rank=rank, size=world), micro_batching=micro_batching,
                          optimizer=optimizer, scheduler=scheduler, grad_clip=1.0)


def loss_for(role, mode, layout):
    layout, _, fused = layout.partition("+")
    forward = SequenceForward(packed=layout == "packed", share_prompts=layout == "shared", fused_head=fused == "fused")
    if role == "actor":
        actor = ActorConfig(loss_agg_mode=mode, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1,
                            kl_loss_type="low_var_kl", **ACTOR_SETTINGS)
        return PolicyLoss(forward=forward, temperature=1.0, actor=actor, loss_scale_factor=HORIZON)
    return ValueLoss(forward=forward, critic=CriticConfig(cliprange_value=0.5, loss_agg_mode=mode),
                     loss_scale_factor=HORIZON)


def micro_batching_for(micro, local_size, grad_sync="step"):
    """``grad_sync`` is ``step`` or ``micro_batch``, optionally ``+gather_once`` (``fsdp.gather_once``)."""
    grad_sync, _, gather = grad_sync.partition("+")
    options = dict(grad_sync=grad_sync, gather_once=gather == "gather_once")
    if micro == "tokens":
        return MicroBatching(max_tokens=14, **options)  # rows hold 2..11 tokens: 2-4 rows per micro-batch
    return MicroBatching(micro_batch_size=local_size if micro == "whole" else int(micro), **options)


def run_cases(rank, world, dirs, data, cases, out_path):
    local = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    batch = Batch(tensors={name: tensor[local] for name, tensor in data.items()})
    results, communication = {}, {}
    for case in cases:
        role, mode, micro, layout, full_step, grad_sync = case
        micro_batching = micro_batching_for(micro, len(batch), grad_sync)
        engine = engine_for(role, dirs[role], rank, world, micro_batching,
                            keep_gathered=grad_sync.endswith("gather_once"))
        loss = loss_for(role, mode, layout)
        num_micro_batches = len(split_micro_batches(batch, micro_batching, engine.dp)[0])
        forward_rows = []
        engine.model.get_input_embeddings().register_forward_pre_hook(
            lambda module, args: forward_rows.append(args[0].shape[0]))
        with CollectiveCounter() as counter:
            if full_step:
                engine.optimizer_step(batch, loss)
            else:
                engine.accumulate_gradients(batch, loss)
        if full_step:
            tensors = {name: full_tensor(param.detach()) for name, param in engine.model.named_parameters()}
        else:
            tensors = {name: full_tensor(param.grad) for name, param in engine.model.named_parameters()}
        results[case] = tensors
        shard_groups = sum(isinstance(module, FSDPModule) for module in engine.model.modules())
        communication[case] = (counter.total("reduce_scatter"), num_micro_batches, shard_groups,
                               counter.total("all_gather"), sum(forward_rows))
    if rank == 0:
        torch.save((results, communication), out_path)


def relative_error(tensors, reference):
    numerator = sum(float((tensors[name] - reference[name]).pow(2).sum()) for name in reference)
    denominator = sum(float(reference[name].pow(2).sum()) for name in reference)
    return (numerator / denominator) ** 0.5


# (role, loss_agg_mode, micro-batching, layout, full optimizer step, grad_sync)
GRADIENT_CASES = [(role, mode, micro, layout, False, "step")
                  for role, mode, micro, layout in itertools.product(("actor", "critic"), MODES, MICRO, LAYOUTS)]
STEP_CASES = [("actor", "token-mean", "2", "packed", True, "step"),
              ("actor", "seq-mean-token-sum", "2", "shared", True, "step"),
              ("critic", "seq-mean-token-mean", "tokens", "padded", True, "step")]
# A reduce-scatter after every micro-batch: only sharded gradients accumulate, the update must not change.
SYNC_EACH_CASES = [("actor", "seq-mean-token-sum-norm", "1", "padded", True, "micro_batch"),
                   ("critic", "token-mean", "tokens", "packed", True, "micro_batch")]
# Parameters all-gathered once for all micro-batches of the step (kept through forward and backward).
GATHER_ONCE_CASES = [("actor", "token-mean", "1", "padded", True, "step+gather_once"),
                     ("critic", "seq-mean-token-mean", "tokens", "packed", True, "micro_batch+gather_once")]

# The LM head fused into the log-softmax (model.use_fused_kernels; the actor's loss has an entropy term).
FUSED_CASES = [("actor", "token-mean", "2", "packed+fused", True, "step"),
               ("actor", "seq-mean-token-sum", "1", "shared+fused", True, "micro_batch"),
               ("actor", "seq-mean-token-mean", "tokens", "padded+fused", True, "step+gather_once")]
OPTIMIZER_STEP_CASES = STEP_CASES + SYNC_EACH_CASES + GATHER_ONCE_CASES + FUSED_CASES


@pytest.fixture(scope="module", params=[1, 2], ids=["dp1", "dp2"])
def engine_run(request, setup, tmp_path_factory):
    actor_dir, critic_dir, data = setup
    out_path = tmp_path_factory.mktemp(f"dp{request.param}") / "results.pt"
    run_on_gloo(request.param, run_cases, {"actor": actor_dir, "critic": critic_dir}, data,
                GRADIENT_CASES + OPTIMIZER_STEP_CASES, out_path)
    results, communication = torch.load(out_path)
    return request.param, results, communication


@pytest.fixture(scope="module")
def engine_results(engine_run):
    return engine_run[1]


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("mode", MODES)
def test_gradient_equals_single_batch_reference(engine_results, setup, role, mode):
    actor_dir, critic_dir, data = setup
    _, reference = reference_gradients(role, actor_dir if role == "actor" else critic_dir, data, mode)
    assert sum(float(g.abs().sum()) for g in reference.values()) > 0
    errors = {(micro, layout): relative_error(engine_results[(role, mode, micro, layout, False, "step")], reference)
              for micro in MICRO for layout in LAYOUTS}
    worst = max(errors.values())
    assert worst <= 1e-5, errors


def test_shared_prompts_ran_one_row_per_prompt(engine_run):
    """The ``shared`` cases above really ran grouped rows: micro-batches of 2 (a prompt pair) and the whole batch
    go through the model as half as many rows; single rows and packed ones as many as there are sequences."""
    world, _, communication = engine_run
    local = BATCH // world
    for role, mode in itertools.product(("actor", "critic"), MODES):
        rows = {(micro, layout): communication[(role, mode, micro, layout, False, "step")][4]
                for micro in MICRO for layout in LAYOUTS}
        assert rows[("2", "shared")] == rows[("whole", "shared")] == local // 2, rows
        assert rows[("1", "shared")] == rows[("2", "padded")] == local, rows


@pytest.mark.parametrize("case", OPTIMIZER_STEP_CASES,
                         ids=lambda case: f"{case[0]}-{case[1]}-micro{case[2]}-{case[3]}-sync_{case[5]}")
def test_optimizer_step_equals_reference(engine_results, setup, case):
    role, mode = case[0], case[1]
    actor_dir, critic_dir, data = setup
    model, _ = reference_gradients(role, actor_dir if role == "actor" else critic_dir, data, mode)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=ADAM_EPS)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    optimizer.step()
    after = {name: param.detach() for name, param in model.named_parameters()}
    update = {name: after[name] - before[name] for name in after}
    engine_update = {name: engine_results[case][name] - before[name] for name in after}
    assert relative_error(engine_update, update) <= 1e-5


def test_grad_sync_sets_the_reduce_scatters_per_step(engine_run):
    """``step``: one gradient reduce-scatter per shard group per optimizer step; ``micro_batch``: one per group per
    micro-batch (so the ``micro_batch`` cases above really ran sharded accumulation). One rank reduces nothing."""
    world, _, communication = engine_run
    for case in STEP_CASES + SYNC_EACH_CASES + GATHER_ONCE_CASES:
        reduce_scatters, num_micro_batches, groups, _, _ = communication[case]
        assert num_micro_batches >= 2, case  # accumulation happens
        expected = groups * (num_micro_batches if case[5].startswith("micro_batch") else 1)
        assert reduce_scatters == (expected if world > 1 else 0), case


def test_kept_gathered_single_rank_is_not_fsdp2(engine_run):
    """``fsdp.gather_once`` on one rank: the model is not FSDP2-wrapped at all (the cases above show the update
    unchanged); otherwise one group per decoder layer plus the root."""
    world, _, communication = engine_run
    for case in STEP_CASES + SYNC_EACH_CASES + GATHER_ONCE_CASES:
        groups = communication[case][2]
        no_fsdp = world == 1 and case[5].endswith("gather_once")
        assert groups == (0 if no_fsdp else 2 + 1), case  # the tiny model has 2 decoder layers


def test_gather_once_gathers_each_group_once_per_step(engine_run):
    """Default: every shard group all-gathers twice per micro-batch (forward, and again in backward); ``gather_once``:
    once per step, whatever the number of micro-batches. One rank gathers nothing."""
    world, _, communication = engine_run
    for case in STEP_CASES + GATHER_ONCE_CASES:
        _, num_micro_batches, groups, all_gathers, _ = communication[case]
        gathers = groups if case[5].endswith("gather_once") else 2 * groups * num_micro_batches
        if world > 1:  # the clip norm adds no all-gather; an extra one would mean parameters gathered again
            assert all_gathers == gathers, (case, all_gathers, num_micro_batches, groups)
        else:
            assert all_gathers == 0, case


def test_scaled_loss_is_caught(setup):
    """Guard on the guard: a per-micro-batch normaliser (the classic bug) is far outside the tolerance."""
    actor_dir, _, data = setup
    _, reference = reference_gradients("actor", actor_dir, data, "token-mean")
    wrong = {}
    for half in (slice(0, 4), slice(4, 8)):
        part = {name: tensor[half] for name, tensor in data.items()}
        _, grads = reference_gradients("actor", actor_dir, part, "token-mean")
        for name, grad in grads.items():
            wrong[name] = wrong.get(name, 0) + grad / 2  # mean of per-micro-batch means
    assert relative_error(wrong, reference) > 1e-2


# ------------------------------------------------------------------------ multi-turn rows (agent trajectories)
def make_multi_turn_data(seed: int = 1) -> dict[str, torch.Tensor]:
    """``make_data`` rows turned into agent trajectories: inside each response, observation tokens (a tool's
    answer) that the model attends to (attention 1) but that take no loss and do not count in any normaliser
    (response_mask 0); their advantages and old log-probs are set to large values, which must change nothing."""
    data = make_data(seed)
    observation = torch.zeros_like(data["response_mask"])
    for row, (start, stop) in enumerate([(1, 3), (0, 0), (1, 2), (0, 0), (2, 5), (1, 2), (0, 0), (1, 4)]):
        observation[row, start:stop] = data["response_mask"][row, start:stop]
    data["response_mask"] = data["response_mask"] * (1 - observation)
    data["advantages"] = torch.where(observation.bool(), torch.full_like(data["advantages"], 50.0),
                                     data["advantages"])
    data["log_prob_noise"] = torch.where(observation.bool(), torch.full_like(data["log_prob_noise"], 5.0),
                                         data["log_prob_noise"])
    return data


MULTI_TURN_CASES = [(role, mode, micro, layout, False, "step")
                    for role, mode in (("actor", "token-mean"), ("actor", "seq-mean-token-mean"),
                                       ("critic", "token-mean"))
                    for micro, layout in itertools.product(("1", "tokens"), ("padded", "packed"))]


@pytest.fixture(scope="module", params=[1, 2], ids=["dp1", "dp2"])
def multi_turn_run(request, setup, tmp_path_factory):
    actor_dir, critic_dir, _ = setup
    data = make_multi_turn_data()
    assert int(((data["attention_mask"][:, PROMPT:] == 1) & (data["response_mask"] == 0)).sum()) > 0
    with torch.no_grad():
        current = reference_log_probs(AutoModelForCausalLM.from_pretrained(actor_dir), data)
    data["old_log_probs"] = current + data.pop("log_prob_noise")
    data["ref_log_probs"] = (current + data.pop("ref_noise")) * data["attention_mask"][:, PROMPT:]
    out_path = tmp_path_factory.mktemp(f"multi_turn_dp{request.param}") / "results.pt"
    run_on_gloo(request.param, run_cases, {"actor": actor_dir, "critic": critic_dir}, data, MULTI_TURN_CASES,
                out_path)
    results, _ = torch.load(out_path)
    return data, results


@pytest.mark.parametrize("role, mode", [("actor", "token-mean"), ("actor", "seq-mean-token-mean"),
                                        ("critic", "token-mean")])
def test_multi_turn_rows_train_only_on_model_tokens(multi_turn_run, setup, role, mode):
    """Gradients with observation tokens inside responses equal the reference that masks them out of the loss and
    the token normaliser, for every micro-batching, padded or packed, on 1 and 2 ranks."""
    actor_dir, critic_dir, _ = setup
    data, results = multi_turn_run
    _, reference = reference_gradients(role, actor_dir if role == "actor" else critic_dir, data, mode)
    errors = {(micro, layout): relative_error(results[(role, mode, micro, layout, False, "step")], reference)
              for micro, layout in itertools.product(("1", "tokens"), ("padded", "packed"))}
    assert max(errors.values()) <= 1e-5, errors

"""MoE routing replay (R3) against a stale rollout: how close the trainer's log-probs come to the rollout's with and
without replaying the rollout's routing, once the policy has moved on.

The HF engine generates with the trainer's own module, so at the rollout's weights the two route identically (100 %
agreement: no gap to close). The gap R3 is for opens when the rollout's routing is not the trainer's — another engine
(vLLM's kernels), or weights one version behind (``async_training``'s one-step-off and bounded modes). This measures
the second kind on CPU, with real pieces: a tiny random Qwen3-MoE generates with the HF engine recording each token's
experts (``rollout.routing_capture``), then ``--updates`` Adam steps of a policy-gradient loss on that rollout (random
advantages: a stand-in for one training step) move the policy on, and the trainer's log-probs of the rollout's tokens
are computed at the new weights, routing on their own and replaying the record. Prints, for each side, the mean and
max |trainer − rollout| log-prob over response tokens and the fraction of (token, router) pairs whose experts the
new routers would change, per seed, and the ratio of the means.

    PYTHONPATH=. python benchmarks/routing_replay.py [--seeds 3] [--updates 1] [--lr 1e-5] [--new-tokens 24]
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from benchmarks.common import machine_info, markdown_table, write_json
from hybridrl.modeling.routing_replay import install_routing_replay
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

VOCAB = 96
SCENARIOS = ("same_module", "bf16_engine", "stale")
SPEC = TinyModelSpec(architecture="qwen3_moe", hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                     intermediate_size=512)


def prompts(count: int, length: int, seed: int) -> Batch:
    ids = torch.randint(4, VOCAB, (count, length), generator=torch.Generator().manual_seed(seed))
    return Batch(tensors={Fields.INPUT_IDS: ids, Fields.ATTENTION_MASK: torch.ones_like(ids)},
                 non_tensors={Fields.UID: [str(row) for row in range(count)]})


def log_probs(model, rollout: Batch, routed) -> torch.Tensor:
    return response_log_probs(model, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK],
                              rollout[Fields.RESPONSES].shape[1], routed_experts=routed)[0]


def moved_on(model, rollout: Batch, updates: int, lr: float, seed: int) -> None:
    """``updates`` Adam steps of −advantage × log-prob on ``rollout`` (random advantages, own routing)."""
    mask = rollout[Fields.RESPONSE_MASK].float()
    advantages = torch.randn(len(rollout), 1, generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(updates):
        loss = -(advantages * log_probs(model, rollout, None) * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def gaps(model, rollout: Batch, state) -> dict[str, float]:
    mask = rollout[Fields.RESPONSE_MASK].bool()
    behaviour = rollout[Fields.ROLLOUT_LOG_PROBS]
    result = {}
    with torch.no_grad():
        for side, routed in (("own", None), ("replayed", rollout[Fields.ROUTED_EXPERTS])):
            state.reset()
            gap = (log_probs(model, rollout, routed) - behaviour).abs()[mask]
            result[f"{side}_mean"], result[f"{side}_max"] = float(gap.mean()), float(gap.max())
            if routed is not None:
                result["routing_changed"] = 1.0 - state.agreement()
    return result


def one_seed(seed: int, args) -> dict[str, float]:
    torch.manual_seed(seed)
    model = build_tiny_model(SPEC, VOCAB, pad_token_id=0, eos_token_id=1)
    # the engine: a bf16 copy of the fp32 weights, generating with its own numerics (as vLLM's bf16 engine beside an
    # fp32 trainer); the same-module case is the trainer's model generating itself
    bf16_engine = copy.deepcopy(model).to(torch.bfloat16)
    sampling = SamplingParams(n=4, max_new_tokens=args.new_tokens, seed=seed)
    bf16_rollout = HFRollout(bf16_engine, pad_token_id=0, eos_token_ids=[1], record_routing=True).generate(
        prompts(8, 12, seed), sampling)
    rollout = HFRollout(model, pad_token_id=0, eos_token_ids=[1], record_routing=True).generate(
        prompts(8, 12, seed), sampling)
    state = install_routing_replay(model)
    row = {"seed": seed}
    for scenario, behaviour in (("same_module", rollout), ("bf16_engine", bf16_rollout)):
        row.update({f"{scenario}_{key}": value for key, value in gaps(model, behaviour, state).items()})
    moved_on(model, rollout, args.updates, args.lr, seed)
    row.update({f"stale_{key}": value for key, value in gaps(model, rollout, state).items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--new-tokens", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [one_seed(seed, args) for seed in range(args.seeds)]
    columns = [column for column in rows[0] if not column.endswith("_max")]
    print(markdown_table(columns, [[f"{row[c]:.3g}" if isinstance(row[c], float) else row[c] for c in columns]
                                   for row in rows]))
    summary = {}
    for scenario in SCENARIOS:
        own = statistics.mean(row[f"{scenario}_own_mean"] for row in rows)
        replayed = statistics.mean(row[f"{scenario}_replayed_mean"] for row in rows)
        changed = statistics.mean(row[f"{scenario}_routing_changed"] for row in rows)
        own_max = max(row[f"{scenario}_own_max"] for row in rows)
        replayed_max = max(row[f"{scenario}_replayed_max"] for row in rows)
        summary[scenario] = {"own_mean": own, "replayed_mean": replayed, "own_max": own_max,
                             "replayed_max": replayed_max, "routing_changed": changed}
        print(f"{scenario}: |trainer - rollout| log-prob mean / max, own routing {own:.3g} / {own_max:.3g}, "
              f"replayed {replayed:.3g} / {replayed_max:.3g} (replay {own / replayed:.2f}x / "
              f"{own_max / replayed_max:.2f}x closer); the trainer's routers would change {changed:.2%} of routings")
    write_json("routing_replay", {"args": vars(args), "machine": machine_info(), "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()

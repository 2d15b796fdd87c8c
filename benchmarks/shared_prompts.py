"""Shared prompts (``model.share_prompts``) vs padded and packed rows on GRPO-shaped batches.

A mini-batch of ``--prompts`` prompts × ``--n`` responses each, the responses to one prompt consecutive (as the
rollout returns them), prompt lengths uniform in ``[P/2, P]`` (equal within a group), response lengths uniform in
``[R/4, R]``. One forward/backward of the whole mini-batch with the actor's PPO loss
(``TrainingEngine.accumulate_gradients``, micro-batches of ``--micro`` rows, single process) in three layouts:

- ``padded``  — each row on its own (all-padding columns of the micro-batch dropped);
- ``shared``  — ``model.share_prompts``: the rows of one prompt as one row over a single copy of it, where the FLOP
  estimate says so (``hybridrl.modeling.shared_prompts.grouping_pays``), else padded;
- ``packed``  — ``model.use_remove_padding``: the real tokens of the micro-batch as one row.

For each (P, R) regime: ``positions`` = token positions the layers compute (rows × width; packed: real tokens),
``grouped`` = micro-batches the shared layout grouped, step time (median of ``--repeats`` after a warm-up) and the
speed-up over padded. Long responses to short prompts are where grouping stops paying (each group row's attention is
dense over all of its responses): the cost model keeps those padded, and the table shows it.

Run from the repository root: ``PYTHONPATH=. python benchmarks/shared_prompts.py [--model DIR]`` (default: a
4-layer Llama of hidden 256 built from a config; ``--model`` takes any local HF causal LM, e.g. SmolLM2-135M).
Writes ``benchmarks/results/shared_prompts.json``. No timing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hybridrl.protocol import Batch, Fields
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import PolicyLoss, SequenceForward
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching, split_micro_batches
from hybridrl.modeling.attention import attention_implementation
from hybridrl.modeling.shared_prompts import grouping_pays, prompt_groups, trim_padding

import common

SPEC = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=688)
REGIMES = ((44, 32), (128, 64), (64, 256), (32, 512))  # (prompt, response) lengths


def grpo_batch(prompts: int, n: int, prompt_length: int, response_length: int, vocab: int, seed: int = 0) -> Batch:
    """``prompts × n`` rows ``[left-padded prompt | right-padded response]``, one prompt per run of ``n`` rows."""
    generator = torch.Generator().manual_seed(seed)
    rows = prompts * n
    input_ids = torch.randint(4, vocab, (rows, prompt_length + response_length), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    for prompt in range(prompts):
        length = int(torch.randint(prompt_length // 2, prompt_length + 1, (1,), generator=generator))
        for row in range(prompt * n, (prompt + 1) * n):
            input_ids[row, :prompt_length] = input_ids[prompt * n, :prompt_length]
            response = int(torch.randint(max(response_length // 4, 1), response_length + 1, (1,), generator=generator))
            attention_mask[row, prompt_length - length:prompt_length + response] = 1
    input_ids = input_ids * attention_mask
    response_mask = attention_mask[:, prompt_length:].clone()
    return Batch(tensors={Fields.INPUT_IDS: input_ids, Fields.ATTENTION_MASK: attention_mask,
                          Fields.RESPONSES: input_ids[:, prompt_length:], Fields.RESPONSE_MASK: response_mask,
                          Fields.ADVANTAGES: torch.randn(rows, response_length, generator=generator) * response_mask,
                          Fields.OLD_LOG_PROBS: -4.4 * response_mask.float()})


def positions_and_groupings(model, micro_batches: list[Batch], layout: str) -> tuple[int, int]:
    """Token positions the layers compute in ``layout``, and how many micro-batches ran grouped."""
    positions, grouped = 0, 0
    for micro in micro_batches:
        response_length = micro[Fields.RESPONSES].shape[-1]
        if layout == "packed":
            positions += int(micro[Fields.ATTENTION_MASK].sum())
            continue
        trimmed = trim_padding(micro[Fields.INPUT_IDS], micro[Fields.ATTENTION_MASK], response_length)
        groups = prompt_groups(trimmed)
        if layout == "shared" and grouping_pays(model, trimmed, groups):
            grouped += 1
            slots = max(len(group) for group in groups)
            positions += len(groups) * (trimmed.prompt_width + slots * trimmed.response_width)
        else:
            positions += len(micro) * (trimmed.prompt_width + trimmed.response_width)
    return positions, grouped


def drain_device(batch: Batch) -> None:
    """Wait for the GPU's queue when the batch lives on one (timings then cover the kernels, not their launch)."""
    if batch[Fields.INPUT_IDS].is_cuda:
        torch.cuda.synchronize()


def time_layouts(model, batch: Batch, micro: int, repeats: int, gather_once: bool = False) -> dict[str, list[float]]:
    times = {"padded": [], "shared": [], "packed": []}
    for repeat in range(repeats + 1):  # the first round is a warm-up
        for layout in times:
            drain_device(batch)
            start = time.perf_counter()
            run_layout(model, batch, micro, layout, gather_once)
            drain_device(batch)
            if repeat:
                times[layout].append(time.perf_counter() - start)
    return times


def run_layout(model, batch: Batch, micro: int, layout: str, gather_once: bool = False) -> None:
    """One forward/backward of ``batch`` (PPO loss, micro-batches of ``micro`` rows) in ``layout``; grads cleared.
    ``gather_once``: an FSDP2 model's parameters stay gathered through the micro-batches (``*.fsdp.gather_once``)."""
    forward = SequenceForward(packed=layout == "packed", share_prompts=layout == "shared")
    loss = PolicyLoss(forward=forward, temperature=1.0,
                      loss_scale_factor=float(batch[Fields.RESPONSE_MASK].shape[-1]))
    engine = TrainingEngine(model, dp=DataParallelGroup(),
                            micro_batching=MicroBatching(micro_batch_size=micro, gather_once=gather_once))
    engine.accumulate_gradients(batch, loss)
    model.zero_grad(set_to_none=True)


def build(model_dir: str | None):
    if model_dir is None:
        return build_tiny_model(SPEC, 84, pad_token_id=0, eos_token_id=1).train(), 84, "tiny Llama (hidden 256 × 4)"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention_implementation("auto", "cpu"))
    return model.train(), model.config.vocab_size, model_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="local HF causal LM directory (default: a tiny Llama)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    machine = common.machine_info()
    model, vocab, name = build(args.model)
    results = []
    print(f"machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs, {torch.get_num_threads()} threads; "
          f"model: {name} (fp32); {args.prompts} prompts × {args.n}, micro-batches of {args.micro} rows")
    print(f"{'P':>4} {'R':>4} {'layout':<7} {'positions':>9} {'grouped':>7} {'step s':>8} {'speed-up':>8}")
    for prompt_length, response_length in REGIMES:
        batch = grpo_batch(args.prompts, args.n, prompt_length, response_length, vocab)
        micro_batches, _ = split_micro_batches(batch, MicroBatching(micro_batch_size=args.micro), DataParallelGroup())
        times = time_layouts(model, batch, args.micro, args.repeats)
        padded = statistics.median(times["padded"])
        for layout, seconds in times.items():
            positions, grouped = positions_and_groupings(model, micro_batches, layout)
            row = {"prompt_length": prompt_length, "response_length": response_length, "layout": layout,
                   "positions": positions, "grouped_micro_batches": grouped, "micro_batches": len(micro_batches),
                   "seconds": statistics.median(seconds), "seconds_best": min(seconds),
                   "speed_up": padded / statistics.median(seconds)}
            results.append(row)
            print(f"{prompt_length:>4} {response_length:>4} {layout:<7} {positions:>9} "
                  f"{grouped:>3}/{len(micro_batches):<3} {row['seconds']:>8.3f} {row['speed_up']:>8.2f}")
    path = common.write_json("shared_prompts", {"machine": machine, "model": name, "args": vars(args), "rows": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""The actor's log-prob forward + backward along the three LM-head paths of ``hybridrl.modeling.scored_head``.

``reference``: the head on every position ``logits_to_keep`` names, ``[rows, K, vocab]`` logits, their fp32 copy,
then the scored positions selected (and scattered back in backward). ``selected`` (the default): the head's matmul on
the scored positions' hidden states alone, ``[M, vocab]`` logits in the compute dtype. ``fused``
(``model.use_fused_kernels``): the head run chunk by chunk inside the log-softmax and recomputed in backward
(``hybridrl.algorithms.token_head``), no ``[M, vocab]`` tensor kept. Per workload, one micro-batch's
``response_log_probs`` with entropy, then a backward of a token-weighted sum, the sides alternating: time (best and
median), the peak of live tensor bytes created during the pass (``LiveTensorPeak``, in a separate untimed pass), and
the largest log-prob difference from the reference.

Workloads (models built from configs in memory with random weights, nothing read or downloaded):
- ``smollm2``: SmolLM2-135M's shapes (30 layers, vocab 49152, tied head), one micro-batch of the vs_trl run:
  8 rows of 44 prompt + 20–32 response tokens, 4 responses per prompt (the shared-prompt layout);
- ``smollm2_head``: the same micro-batch through SmolLM2's embeddings, final norm and head alone (no decoder
  layer): the part of the pass the three paths differ in, without the body's time and its noise;
- ``long``: a 2-layer body under Qwen2.5-0.5B's head (hidden 896, vocab 151936), 2 rows of 16 + 1024 tokens: where
  the logits dominate memory.

    PYTHONPATH=. python benchmarks/lm_head.py [--workloads smollm2_head,smollm2,long] [--repeats 5] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import machine_info, write_json

WORKLOADS = {
    "smollm2": dict(config=dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
                    rows=8, prompt=44, response=32, min_response=20, group=4),
    "smollm2_head": dict(config=dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=0,
                                     num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
                         rows=8, prompt=44, response=32, min_response=20, group=4),
    "long": dict(config=dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                             num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
                 rows=2, prompt=16, response=1024),
}


def build(workload: dict, dtype: torch.dtype):
    """The model (fp32 master weights; ``dtype`` compute through the one-rank casts) and a batch of rows: ``group``
    consecutive rows share a prompt; response lengths spread evenly from ``min_response`` to ``response``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybridrl.modeling.single_rank import apply_compute_dtype

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=4096, **workload["config"])
    model = apply_compute_dtype(LlamaForCausalLM(config), dtype)
    rows, prompt, response = workload["rows"], workload["prompt"], workload["response"]
    input_ids = torch.randint(0, config.vocab_size, (rows, prompt + response))
    group = workload.get("group", 1)
    input_ids[:, :prompt] = input_ids[::group, :prompt].repeat_interleave(group, dim=0)
    attention_mask = torch.ones_like(input_ids)
    lengths = torch.linspace(workload.get("min_response", response), response, rows).round().long()
    for row, length in enumerate(lengths.tolist()):
        attention_mask[row, prompt + length:] = 0
    return model, input_ids, attention_mask


SIDES = {"reference": dict(head_on_scored=False), "selected": dict(head_on_scored=True),
         "fused": dict(fused_head=True)}


def one_pass(model, input_ids, attention_mask, response: int, side: str) -> torch.Tensor:
    from hybridrl.modeling.sequences import response_log_probs

    log_probs, entropy = response_log_probs(model, input_ids, attention_mask, response, with_entropy=True,
                                            share_prompts=True, **SIDES[side])
    weights = torch.linspace(-1.0, 1.0, log_probs.numel()).view_as(log_probs)
    (log_probs * weights).sum().backward()
    model.zero_grad(set_to_none=True)
    return log_probs.detach()


def measure(name: str, workload: dict, dtype: torch.dtype, repeats: int) -> dict:
    from hybridrl.autotune.memory_probe import LiveTensorPeak
    from hybridrl.modeling.single_rank import casts_kept

    model, input_ids, attention_mask = build(workload, dtype)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    outputs, peaks = {}, {}
    with casts_kept(model):
        for side in SIDES:  # warm-up, the log-probs compared, and the memory peak (untimed)
            outputs[side] = one_pass(model, input_ids, attention_mask, workload["response"], side)
            with LiveTensorPeak() as probe:
                one_pass(model, input_ids, attention_mask, workload["response"], side)
            peaks[side] = probe.peak_bytes
        for repeat in range(repeats):
            for side in SIDES if repeat % 2 == 0 else reversed(SIDES):
                started = time.perf_counter()
                one_pass(model, input_ids, attention_mask, workload["response"], side)
                times[side].append(time.perf_counter() - started)
    result = {side: {"best_s": min(values), "median_s": statistics.median(values), "peak_mib": peaks[side] / 2**20,
                     "reference_over_side_median": statistics.median(times["reference"]) / statistics.median(values),
                     "side_over_reference_peak": peaks[side] / peaks["reference"],
                     "max_log_prob_difference": float((outputs["reference"] - outputs[side]).abs().max())}
              for side, values in times.items()}
    result["scored_tokens"] = int(attention_mask[:, workload["prompt"]:].sum())
    print(f"{name}: {workload['rows']} rows x ({workload['prompt']} + ≤{workload['response']}) tokens "
          f"({result['scored_tokens']} scored), vocab {workload['config']['vocab_size']}, {dtype}, {repeats} repeats "
          f"alternating")
    for side in SIDES:
        row = result[side]
        print(f"  {side:9s} best {row['best_s']:.3f} s  median {row['median_s']:.3f} s  peak {row['peak_mib']:.0f} MiB"
              f"  reference ÷ side {row['reference_over_side_median']:.2f}x time, side ÷ reference "
              f"{row['side_over_reference_peak']:.2f} peak; largest log-prob difference "
              f"{row['max_log_prob_difference']:.1e}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="smollm2_head,smollm2,long")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    results = {"machine": machine_info(), "dtype": args.dtype,
               "workloads": {name: measure(name, WORKLOADS[name], dtype, args.repeats)
                             for name in args.workloads.split(",")}}
    print(f"  results: {write_json('lm_head', results)}")


if __name__ == "__main__":
    main()

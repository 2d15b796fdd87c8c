"""The actor's log-prob forward + backward with the plain LM head against the fused one (``model.use_fused_kernels``).

The plain path materialises ``[tokens, vocab]`` logits (and an fp32 copy, and two gradients of that size in
backward); the fused path runs the head chunk by chunk and recomputes each chunk in backward
(``hybridrl.algorithms.token_head``). Per workload, one micro-batch's ``response_log_probs`` with entropy, then a
backward of a token-weighted sum, both sides alternating: time (best and median), the peak of live tensor bytes
created during the pass (``LiveTensorPeak``, in a separate untimed pass), and the largest log-prob difference.

Workloads (models built from configs in memory with random weights, nothing read or downloaded):
- ``smollm2``: SmolLM2-135M's shapes (30 layers, vocab 49152, tied head), one micro-batch of the vs_trl run:
  8 rows of 44 prompt + 32 response tokens;
- ``long``: a 2-layer body under Qwen2.5-0.5B's head (hidden 896, vocab 151936), 2 rows of 16 + 1024 tokens: where
  the logits dominate memory.

    PYTHONPATH=. python benchmarks/fused_head.py [--workloads smollm2,long] [--repeats 5] [--dtype bfloat16]
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
                    rows=8, prompt=44, response=32),
    "long": dict(config=dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                             num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
                 rows=2, prompt=16, response=1024),
}


def build(workload: dict, dtype: torch.dtype):
    """The model (fp32 master weights; ``dtype`` compute through the one-rank casts) and a batch of rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybridrl.modeling.single_rank import apply_compute_dtype

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=4096, **workload["config"])
    model = apply_compute_dtype(LlamaForCausalLM(config), dtype)
    width = workload["prompt"] + workload["response"]
    input_ids = torch.randint(0, config.vocab_size, (workload["rows"], width))
    attention_mask = torch.ones_like(input_ids)
    return model, input_ids, attention_mask


def one_pass(model, input_ids, attention_mask, response: int, fused: bool) -> torch.Tensor:
    from hybridrl.modeling.sequences import response_log_probs

    log_probs, entropy = response_log_probs(model, input_ids, attention_mask, response, with_entropy=True,
                                            fused_head=fused)
    weights = torch.linspace(-1.0, 1.0, log_probs.numel()).view_as(log_probs)
    (log_probs * weights).sum().backward()
    model.zero_grad(set_to_none=True)
    return log_probs.detach()


def measure(name: str, workload: dict, dtype: torch.dtype, repeats: int) -> dict:
    from hybridrl.autotune.memory_probe import LiveTensorPeak
    from hybridrl.modeling.single_rank import casts_kept

    model, input_ids, attention_mask = build(workload, dtype)
    sides = {"plain": False, "fused": True}
    times: dict[str, list[float]] = {side: [] for side in sides}
    outputs, peaks = {}, {}
    with casts_kept(model):
        for side, fused in sides.items():  # warm-up, the log-probs compared, and the memory peak (untimed)
            outputs[side] = one_pass(model, input_ids, attention_mask, workload["response"], fused)
            with LiveTensorPeak() as probe:
                one_pass(model, input_ids, attention_mask, workload["response"], fused)
            peaks[side] = probe.peak_bytes
        for _ in range(repeats):
            for side, fused in sides.items():
                started = time.perf_counter()
                one_pass(model, input_ids, attention_mask, workload["response"], fused)
                times[side].append(time.perf_counter() - started)
    result = {side: {"best_s": min(values), "median_s": statistics.median(values), "peak_mib": peaks[side] / 2**20}
              for side, values in times.items()}
    result["plain_over_fused_median"] = result["plain"]["median_s"] / result["fused"]["median_s"]
    result["fused_over_plain_peak"] = peaks["fused"] / peaks["plain"]
    result["max_log_prob_difference"] = float((outputs["plain"] - outputs["fused"]).abs().max())
    result["scored_tokens"] = workload["rows"] * workload["response"]
    print(f"{name}: {workload['rows']} rows x ({workload['prompt']} + {workload['response']}) tokens, vocab "
          f"{workload['config']['vocab_size']}, {dtype}, {repeats} repeats alternating")
    for side in sides:
        row = result[side]
        print(f"  {side:6s} best {row['best_s']:.3f} s  median {row['median_s']:.3f} s  peak {row['peak_mib']:.0f} MiB")
    print(f"  plain / fused time (medians) {result['plain_over_fused_median']:.2f}x; fused / plain peak "
          f"{result['fused_over_plain_peak']:.2f}; largest log-prob difference {result['max_log_prob_difference']:.1e}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="smollm2,long")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    results = {"machine": machine_info(), "dtype": args.dtype,
               "workloads": {name: measure(name, WORKLOADS[name], dtype, args.repeats)
                             for name in args.workloads.split(",")}}
    print(f"  results: {write_json('fused_head', results)}")


if __name__ == "__main__":
    main()

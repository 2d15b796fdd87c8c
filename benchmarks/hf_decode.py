"""The HF engine's ``generate`` four ways, alternated in one process on the same prompts and seeds: as it runs by
default (``fast``: decode steps on the weights, ``rollout.hf_fast_decode``, rows that have ended dropped from the
decode batch, products against oneDNN-packed weights), ``fast_keep`` (the same without dropping ended rows),
``fast_unpacked`` (the same with plain ``F.linear`` products) and ``module`` (every decode step through the module's
forward, ended rows dropped).

Per workload: 8 left-padded prompts × 4 samples (the vs_trl batch), sampled at temperature 1, ``--dtype`` compute
(bf16: over fp32 master weights on one rank, ``single_rank`` casts, as the actor runs; fp32: the weights themselves),
2 threads. With ``--ending F`` (default 0.035) a fraction ``F`` of the vocabulary ends a response, so rows end at
spread-out steps (0.035 at 32 new tokens: a mean length of ≈ 20, as SmolLM2's in ``vs_trl.py``; 0: every row runs to
the maximum). Prints the median seconds of each side, the ratios, the rows × forwards each ran, whether the packed
sides sampled the same tokens (in bf16 on CPU they must: the fast step's logits are the module's bit for bit, and a
row's do not depend on the rows beside it) and whether the unpacked side did (in fp32 packed and plain products round
differently in the last bits, which changes some draws).

Workloads (built from configs, random weights, nothing read or downloaded):
- ``smollm2``: SmolLM2-135M's shapes (30 layers, 576 wide, vocab 49152), prompts of 30–44 tokens, 32 new tokens;
- ``tiny``: the demo's model shape (``hybridrl.demo.DEMO_MODEL``: 3 layers, 256 wide, vocab 80), prompts of 6–12
  tokens, 16 new tokens.

    PYTHONPATH=. python benchmarks/hf_decode.py [--workloads smollm2,tiny] [--repeats 7] [--ending 0.035] \
        [--dtype bfloat16|float32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.common import machine_info, markdown_table, write_json
from hybridrl.modeling.attention import attention_implementation
from hybridrl.modeling.single_rank import apply_compute_dtype
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout

WORKLOADS = {
    "smollm2": dict(config=dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
                    prompt=(30, 44), new_tokens=32),
    "tiny": dict(config=dict(vocab_size=80, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                             num_attention_heads=8, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False),
                 prompt=(6, 12), new_tokens=16),
}
PROMPTS, SAMPLES = 8, 4


def build(workload: dict, dtype: torch.dtype) -> tuple[torch.nn.Module, Batch]:
    torch.manual_seed(0)
    config = LlamaConfig(**workload["config"], max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation=attention_implementation("auto", "cpu"))
    model = apply_compute_dtype(model.eval(), dtype)
    shortest, longest = workload["prompt"]
    ids = torch.randint(2, config.vocab_size, (PROMPTS, longest))
    mask = torch.ones_like(ids)
    for row in range(PROMPTS):  # left padding: lengths spread over [shortest, longest]
        mask[row, : (longest - shortest) * row // (PROMPTS - 1)] = 0
    prompts = Batch(tensors={Fields.INPUT_IDS: ids.masked_fill(mask == 0, 0), Fields.ATTENTION_MASK: mask},
                    non_tensors={Fields.UID: [str(row) for row in range(PROMPTS)]})
    return model, prompts


SIDES = {"module": dict(fast_decode=False), "fast": dict(), "fast_keep": dict(drop_ended_rows=False),
         "fast_unpacked": dict(prepack=False)}
PACKED_SIDES = ("module", "fast", "fast_keep")  # the same kernels: the same tokens (fp32 unpacked rounds otherwise)


def measure(name: str, repeats: int, ending: float, dtype: torch.dtype) -> dict:
    workload = WORKLOADS[name]
    model, prompts = build(workload, dtype)
    vocab = workload["config"]["vocab_size"]
    endings = list(range(2, 2 + round(ending * vocab))) or [-1]
    engines = {side: HFRollout(model, pad_token_id=0, eos_token_ids=endings, **options)
               for side, options in SIDES.items()}
    params = SamplingParams(n=SAMPLES, max_new_tokens=workload["new_tokens"], temperature=1.0, seed=0)
    times = {side: [] for side in engines}
    same_tokens, unpacked_same, rows_run, lengths = True, True, {}, []
    for repeat in range(repeats + 1):  # the first round warms all up and is not counted
        turn = repeat % len(engines)
        order = list(engines)[turn:] + list(engines)[:turn]  # each side first, …, last in turn
        responses = {}
        for side in order:
            started = time.perf_counter()
            output = engines[side].generate(prompts, params.with_seed(repeat))
            if repeat:
                times[side].append(time.perf_counter() - started)
                rows_run[side] = rows_run.get(side, 0) + engines[side].decode_rows_run
            responses[side] = output[Fields.RESPONSES]
        lengths += output[Fields.RESPONSE_MASK].sum(1).tolist()
        same_tokens &= all(torch.equal(responses["fast"], responses[side]) for side in PACKED_SIDES)
        unpacked_same &= torch.equal(responses["fast"], responses["fast_unpacked"])
    medians = {side: statistics.median(values) for side, values in times.items()}
    return {"workload": name, **{f"{side}_s": medians[side] for side in SIDES},
            "fast_over_module": medians["module"] / medians["fast"],
            "dropping_speedup": medians["fast_keep"] / medians["fast"],
            "packing_speedup": medians["fast_unpacked"] / medians["fast"], "same_tokens": same_tokens,
            "unpacked_same_tokens": unpacked_same,
            "rows_run": rows_run, "mean_length": statistics.mean(lengths), "decode_path": engines["fast"].decode_path,
            "times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="smollm2,tiny")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ending", type=float, default=0.035, help="fraction of the vocabulary that ends a response")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="compute dtype")
    args = parser.parse_args()
    torch.set_num_threads(2)
    dtype = getattr(torch, args.dtype)
    results = [measure(name, args.repeats, args.ending, dtype) for name in args.workloads.split(",")]
    rows = [[r["workload"], f"{r['mean_length']:.1f}", f"{r['module_s']:.3f} s", f"{r['fast_keep_s']:.3f} s",
             f"{r['fast_unpacked_s']:.3f} s", f"{r['fast_s']:.3f} s", f"{r['fast_over_module']:.2f}×",
             f"{r['dropping_speedup']:.2f}×", f"{r['packing_speedup']:.2f}×",
             f"{r['rows_run']['fast_keep']} → {r['rows_run']['fast']}", r["same_tokens"], r["unpacked_same_tokens"],
             r["decode_path"]]
            for r in results]
    print(f"hf_decode: {args.dtype} compute, {args.repeats} repeats, ending fraction {args.ending}")
    print(markdown_table(["workload", "mean length", "module forward", "fast, all rows", "fast, unpacked",
                          "fast (default)", "module ÷ fast", "all rows ÷ fast", "unpacked ÷ fast", "rows × forwards",
                          "same tokens", "unpacked: same tokens", "path"], rows))
    write_json(f"hf_decode_{args.dtype}", {"benchmark": "hf_decode", "machine": machine_info(),
                                            "repeats": args.repeats, "ending": args.ending, "dtype": args.dtype,
                                            "results": results})


if __name__ == "__main__":
    main()

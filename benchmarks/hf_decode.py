"""The HF engine's ``generate`` with its decode steps run by the fast step (``rollout.hf_fast_decode``, the default)
and by the module's forward, alternated in one process on the same prompts and seeds.

Per workload: 8 left-padded prompts × 4 samples (the vs_trl batch), sampled at temperature 1 to a fixed length (no
EOS), bf16 compute over fp32 master weights on one rank (``single_rank`` casts, as the actor runs), 2 threads. Prints
the median seconds of each side, the ratio, and whether both sides sampled the same tokens (they must: the fast
step's logits are the module's bit for bit on CPU).

Workloads (built from configs, random weights, nothing read or downloaded):
- ``smollm2``: SmolLM2-135M's shapes (30 layers, 576 wide, vocab 49152), prompts of 30–44 tokens, 32 new tokens;
- ``tiny``: the demo's model shape (``hybridrl.demo.DEMO_MODEL``: 3 layers, 256 wide, vocab 80), prompts of 6–12
  tokens, 16 new tokens.

    PYTHONPATH=. python benchmarks/hf_decode.py [--workloads smollm2,tiny] [--repeats 7]
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


def build(workload: dict) -> tuple[torch.nn.Module, Batch]:
    torch.manual_seed(0)
    config = LlamaConfig(**workload["config"], max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation=attention_implementation("auto", "cpu"))
    model = apply_compute_dtype(model.eval(), torch.bfloat16)
    shortest, longest = workload["prompt"]
    ids = torch.randint(2, config.vocab_size, (PROMPTS, longest))
    mask = torch.ones_like(ids)
    for row in range(PROMPTS):  # left padding: lengths spread over [shortest, longest]
        mask[row, : (longest - shortest) * row // (PROMPTS - 1)] = 0
    prompts = Batch(tensors={Fields.INPUT_IDS: ids.masked_fill(mask == 0, 0), Fields.ATTENTION_MASK: mask},
                    non_tensors={Fields.UID: [str(row) for row in range(PROMPTS)]})
    return model, prompts


def measure(name: str, repeats: int) -> dict:
    workload = WORKLOADS[name]
    model, prompts = build(workload)
    engines = {side: HFRollout(model, pad_token_id=0, eos_token_ids=[-1], fast_decode=side == "fast")
               for side in ("module", "fast")}
    params = SamplingParams(n=SAMPLES, max_new_tokens=workload["new_tokens"], temperature=1.0, seed=0)
    times = {side: [] for side in engines}
    same_tokens = True
    for repeat in range(repeats + 1):  # the first round warms both up and is not counted
        order = list(engines) if repeat % 2 else list(reversed(engines))
        responses = {}
        for side in order:
            started = time.perf_counter()
            responses[side] = engines[side].generate(prompts, params.with_seed(repeat))[Fields.RESPONSES]
            if repeat:
                times[side].append(time.perf_counter() - started)
        same_tokens &= torch.equal(responses["module"], responses["fast"])
    medians = {side: statistics.median(values) for side, values in times.items()}
    return {"workload": name, "module_s": medians["module"], "fast_s": medians["fast"],
            "speedup": medians["module"] / medians["fast"], "same_tokens": same_tokens,
            "decode_path": engines["fast"].decode_path, "times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="smollm2,tiny")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = [measure(name, args.repeats) for name in args.workloads.split(",")]
    rows = [[r["workload"], f"{r['module_s']:.3f} s", f"{r['fast_s']:.3f} s", f"{r['speedup']:.2f}×",
             r["same_tokens"], r["decode_path"]] for r in results]
    print(markdown_table(["workload", "module forward", "fast step", "module ÷ fast", "same tokens", "path"], rows))
    write_json("hf_decode", {"benchmark": "hf_decode", "machine": machine_info(), "repeats": args.repeats,
                             "results": results})


if __name__ == "__main__":
    main()

"""vLLM's KV block size on CPU and prefix sharing: a GRPO generation (8 prompts × 4 samples × 32 tokens, the vs_trl
SmolLM2 batch) at several ``rollout.block_size`` values, each in a process of its own, alternated over rounds.

Prefix caching shares whole KV blocks, so the ``n`` samples of a prompt share its prefill up to its last full block.
At vLLM's own CPU default (128 tokens) a 44-token prompt shares nothing and is prefilled once per sample; at 32 (the
smallest block vLLM's CPU attention takes, hybridrl's CPU default) the samples after the first take its 32-token
block from the cache. Prints per block size the median seconds of a ``VLLMRollout.generate``, the ratio to vLLM's
default, the share of prompt tokens served from the cache, and whether every block size sampled the same tokens
(same seeds; the sharing must not change what is generated).

Needs the real model (prompts of realistic length through its chat template):

    PYTHONPATH=. python benchmarks/vllm_block_size.py [--model models/smollm2-135m-instruct] [--blocks 128,32]
        [--rounds 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import vs_trl_task

PROMPTS, SAMPLES, NEW_TOKENS = 8, 4, 32


def _chat_ids(tokenizer, rows) -> list[list[int]]:
    """Each row's prompt through the model's chat template, with the assistant turn opened."""
    return [list(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]) for row in rows]


def _prompt_batch(tokenizer, rows):
    """The rows' chat prompts as one left-padded ``Batch``."""
    from hybridrl.protocol import Batch, Fields

    encoded = tokenizer.pad({"input_ids": _chat_ids(tokenizer, rows)}, return_tensors="pt", padding_side="left")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [str(index) for index in range(len(rows))]})


def child(model: str, block_size: int, repeats: int, rows_file: str) -> dict:
    """One engine at ``block_size``: a warm-up and ``repeats`` timed generations (seeds 100, 101, ...)."""
    import torch
    from transformers import AutoTokenizer

    from hybridrl.config.schema import RolloutConfig
    from hybridrl.protocol import Fields
    from hybridrl.rollout import EngineInputs, build_rollout_engine
    from hybridrl.rollout.base import SamplingParams

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = vs_trl_task.read_rows(Path(rows_file))
    engine = build_rollout_engine("vllm", EngineInputs(
        rollout=RolloutConfig(name="vllm", max_num_seqs=64, block_size=block_size),
        pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id], model_path=model,
        max_model_len=64 + NEW_TOKENS, dtype="bfloat16", seed=1))
    times, digest = [], hashlib.sha256()
    for repeat in range(repeats + 1):
        batch = _prompt_batch(tokenizer, rows[PROMPTS * repeat: PROMPTS * (repeat + 1)])
        engine.llm.reset_prefix_cache()  # as after every weight sync: each step's prompts start uncached
        params = SamplingParams(n=SAMPLES, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=100 + repeat)
        started = time.perf_counter()
        rollout = engine.generate(batch, params)
        elapsed = time.perf_counter() - started
        if repeat:
            times.append(elapsed)
            digest.update(rollout[Fields.RESPONSES].numpy().tobytes())
    return {"block_size": block_size, "times": times, "tokens_sha256": digest.hexdigest(),
            "cached_share": _cached_share(engine, _chat_ids(tokenizer, rows[:PROMPTS]))}


def _cached_share(engine, prompts: list[list[int]]) -> float:
    """The share of prompt tokens vLLM served from its prefix cache when each prompt is submitted ``SAMPLES`` times
    at once (one token each, through the request-level API, which reports the cache hits)."""
    from hybridrl.rollout.base import SamplingParams

    engine.llm.reset_prefix_cache()
    for index, prompt in enumerate(prompts):
        for sample in range(SAMPLES):
            engine.requests.submit(prompt, SamplingParams(max_new_tokens=1, seed=sample),
                                   request_id=f"cached-{index}-{sample}")
    done = engine.requests.run()
    return sum(completion.cached_prompt_tokens for completion in done) / (SAMPLES * sum(map(len, prompts)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--blocks", default="128,32", help="comma-separated block sizes (multiples of 32)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", nargs=3, metavar=("BLOCK", "REPEATS", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.model, int(args.child[0]), int(args.child[1]), args.child[2])))
        return
    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"--model {args.model}: no converted model there (see benchmarks/README.md, vs_trl.py)")
    blocks = [int(block) for block in args.blocks.split(",")]
    runs: dict[int, list[dict]] = {block: [] for block in blocks}
    with tempfile.TemporaryDirectory() as workdir:
        rows_file = vs_trl_task.write_rows(Path(workdir) / "rows.jsonl", PROMPTS * (args.repeats + 1), "question", 9)
        for round_index in range(args.rounds):
            for block in blocks[round_index % len(blocks):] + blocks[:round_index % len(blocks)]:
                runs[block].append(_run_child(args, block, rows_file))
                print(f"[vllm_block_size] round {round_index} block {block}: "
                      f"{[round(t, 3) for t in runs[block][-1]['times']]} s", flush=True)
    _report(args, blocks, runs)


def _run_child(args, block: int, rows_file: Path) -> dict:
    command = [sys.executable, __file__, "--model", args.model, "--child", str(block), str(args.repeats),
               str(rows_file)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


def _report(args, blocks: list[int], runs: dict[int, list[dict]]) -> None:
    medians = {block: common.median([t for run in runs[block] for t in run["times"]]) for block in blocks}
    digests = {run["tokens_sha256"] for block in blocks for run in runs[block]}
    reference = medians[blocks[0]]
    table = [[block, f"{medians[block]:.3f} s", f"{reference / medians[block]:.2f}×",
              f"{100 * runs[block][0]['cached_share']:.0f} %"] for block in blocks]
    print(f"\n{PROMPTS} prompts × {SAMPLES} samples × {NEW_TOKENS} tokens, bf16, {args.rounds} rounds × "
          f"{args.repeats} generations per block size; same tokens at every block size: {len(digests) == 1}")
    header = ["block size", "generate (median)", f"vs block {blocks[0]}", "prompt tokens cached"]
    print(common.markdown_table(header, table))
    common.write_json("vllm_block_size", {"machine": common.machine_info(), "settings": vars(args),
                                          "medians_s": medians, "same_tokens": len(digests) == 1, "runs": runs})


if __name__ == "__main__":
    main()

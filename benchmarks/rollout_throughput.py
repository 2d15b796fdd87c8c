"""Generation throughput of the rollout engines: in-process vLLM (``rollout.name=vllm``) vs transformers ``generate``
(``rollout.name=hf``), on the same tiny models, the same prompts and the same sampling settings.

For each model config both engines generate ``--prompts`` prompts × ``--n`` samples × ``--new-tokens`` tokens
(temperature 1, no EOS stop in practice: random tiny models almost never emit it) ``--repeats`` times after a warm-up;
throughput is generated tokens (``response_mask`` sum) per second of the median wall time. The ratio column is vLLM's
tokens/s over HF's. vLLM's weight-sync time (``update_weights`` with the full model) is reported alongside.

Both engines run in this process with the same torch thread count (``--threads``, default 1 — what the Ray workers
use; on a shared 2-core machine a second thread makes every small op wait at OpenMP barriers for a core, which
measures the neighbours more than the engine) and compute dtype (``--dtype``). The load average is recorded.
Writes ``benchmarks/results/rollout_throughput.json``.

Run from the repository root: ``PYTHONPATH=. python benchmarks/rollout_throughput.py [--dtype bfloat16 --threads 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.config.schema import RolloutConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout import EngineInputs, build_rollout_engine
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.tiny_model import TinyModelSpec, encode_chat, save_tiny_model

RESULTS = Path(__file__).resolve().parent / "results" / "rollout_throughput.json"
MODELS = {
    "tiny": TinyModelSpec(),  # hidden 64, 2 layers
    "small": TinyModelSpec(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=688),
}


def hardware() -> dict:
    model_name = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    return {"cpu": model_name, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1m_at_start": os.getloadavg()[0], "python": platform.python_version(),
            "torch": torch.__version__}


def prompt_batch(tokenizer, num_prompts: int) -> Batch:
    """``num_prompts`` short arithmetic chat prompts, left-padded."""
    texts = [f"{i % 97}+{(7 * i) % 89}=" for i in range(num_prompts)]
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, texts)}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [str(i) for i in range(num_prompts)]})


def measure(engine, prompts: Batch, params: SamplingParams, repeats: int) -> dict:
    """Median/best wall seconds of ``engine.generate`` and the tokens it generated (after one warm-up call)."""
    engine.generate(prompts, params)
    times, tokens = [], 0
    for repeat in range(repeats):
        start = time.perf_counter()
        rollout = engine.generate(prompts, params.with_seed(100 + repeat))
        times.append(time.perf_counter() - start)
        tokens = int(rollout[Fields.RESPONSE_MASK].sum())
    median = statistics.median(times)
    return {"seconds_median": median, "seconds_best": min(times), "tokens": tokens, "tokens_per_s": tokens / median}


def bench_model(label: str, spec: TinyModelSpec, args, workdir: Path) -> dict:
    model_dir = save_tiny_model(workdir / label, spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = prompt_batch(tokenizer, args.prompts)
    params = SamplingParams(n=args.n, max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
    rollout = RolloutConfig(name="vllm", kv_cache_memory_mb=args.kv_cache_mb, max_num_seqs=args.prompts * args.n,
                            max_num_batched_tokens=8192)
    inputs = EngineInputs(rollout=rollout, pad_token_id=tokenizer.pad_token_id,
                          eos_token_ids=[tokenizer.eos_token_id], model=model, model_path=str(model_dir),
                          max_model_len=prompts[Fields.INPUT_IDS].shape[1] + args.new_tokens, dtype=args.dtype)
    results = {"parameters": sum(p.numel() for p in model.parameters()),
               "shape": f"hidden {spec.hidden_size}, {spec.num_layers} layers, {spec.num_heads} heads"}
    start = time.perf_counter()
    vllm_engine = build_rollout_engine("vllm", inputs)
    results["vllm_start_s"] = time.perf_counter() - start
    results["vllm"] = measure(vllm_engine, prompts, params, args.repeats)
    sync = vllm_engine.update_weights(model.named_parameters())
    results["vllm_weight_sync"] = {"seconds": sync.seconds, "bytes": sync.num_bytes, "tensors": sync.num_tensors}
    vllm_engine.close()
    results["hf"] = measure(build_rollout_engine("hf", inputs), prompts, params, args.repeats)
    results["ratio_vllm_over_hf"] = results["vllm"]["tokens_per_s"] / results["hf"]["tokens_per_s"]
    return results


def print_table(results: dict, args) -> None:
    hw = results["hardware"]
    print(f"\n{args.prompts} prompts × n={args.n} × {args.new_tokens} new tokens, {args.dtype}, "
          f"{hw['torch_threads']} thread(s) on {hw['cpu']} ({hw['logical_cpus']} logical CPUs; 1-min load average "
          f"{hw['load_average_1m_at_start']:.1f} at start, {hw['load_average_1m_at_end']:.1f} at end)")
    header = f"{'model':<8}{'params':>9}{'engine':>7}{'median s':>10}{'tokens':>8}{'tok/s':>10}{'ratio':>7}"
    print(header + "\n" + "-" * len(header))
    for label, row in results["models"].items():
        for engine in ("vllm", "hf"):
            ratio = f"{row['ratio_vllm_over_hf']:.1f}x" if engine == "vllm" else "1.0x"
            print(f"{label:<8}{row['parameters']:>9,}{engine:>7}{row[engine]['seconds_median']:>10.3f}"
                  f"{row[engine]['tokens']:>8}{row[engine]['tokens_per_s']:>10.0f}{ratio:>7}")
        sync = row["vllm_weight_sync"]
        print(f"{'':<8}({row['shape']}) vLLM start {row['vllm_start_s']:.1f} s; weight sync {sync['tensors']} tensors, "
              f"{sync['bytes'] / 2**20:.1f} MiB in {sync['seconds'] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-cache-mb", type=int, default=64)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {"hardware": hardware(), "settings": vars(args), "models": {}}
    with tempfile.TemporaryDirectory() as workdir:
        for label in args.models:
            results["models"][label] = bench_model(label, MODELS[label], args, Path(workdir))
    results["hardware"]["load_average_1m_at_end"] = os.getloadavg()[0]
    print_table(results, args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()

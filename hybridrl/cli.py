"""The ``hybridrl`` command line: ``hybridrl <command> [--config-name NAME] [key=value ...]``.

Overrides use Hydra's syntax (``rollout.n=8``, ``algorithm=gae`` to pick a preset, ``+extra.x=1`` to add a key).
User mistakes print one clear message and exit with status 2 — never a traceback. A user mistake is a ``ValueError``
(``ConfigError`` included: docs/architecture.md §5, errors — bad files, rows, paths, checkpoints) or a request the cluster can never
hold (``ResourceUnavailableError``); a run stopped by a health alarm (``TrainingHealthError``) is reported the same
way. ``HYBRIDRL_TRACEBACK=1`` re-raises them to show where they came from.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from hybridrl.config import ConfigError
from hybridrl.utils.signals import TerminationRequested

# Before transformers is imported anywhere: its per-file progress bars would bury the trainer's progress display.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

Handler = Callable[[argparse.Namespace], int]
Arguments = Callable[[argparse.ArgumentParser], None]
COMMANDS: dict[str, tuple[str, Optional[str], Handler]] = {}
# A command's own extra arguments (beyond --config-name, --no-check-paths and the overrides, when it takes a config).
ARGUMENTS: dict[str, Arguments] = {}


def command(name: str, help_text: str, config_name: Optional[str] = "ppo_trainer",
            arguments: Optional[Arguments] = None) -> Callable[[Handler], Handler]:
    """Register a sub-command handler ``(args) -> exit status`` whose default config is ``config_name``
    (``None``: the command takes no config and no overrides; ``""``: it does, and picks one itself when
    ``--config-name`` is not given) and which may declare its own ``arguments``."""

    def register(handler: Handler) -> Handler:
        COMMANDS[name] = (help_text, config_name, handler)
        if arguments is not None:
            ARGUMENTS[name] = arguments
        return handler

    return register


COMMAND_OF_SCHEMA = {"TrainConfig": "train", "SFTConfig": "sft", "RMConfig": "rm", "DPOConfig": "dpo"}
RUN_IN_PROGRESS: dict[str, str] = {}  # the run directory and resume mode of the command running (the Ctrl-C line)


def load_from_args(args: argparse.Namespace, **options):
    """The config a command's ``--config-name``, ``--config-dir``, ``--config-path`` and overrides select."""
    from hybridrl.config import load_config

    options.setdefault("check_paths", not args.no_check_paths)
    return load_config(args.overrides, args.config_name, conf_dir=args.config_path, extra_dirs=args.config_dir or (),
                       **options)


def load_for(command_name: str, args: argparse.Namespace, schema: type):
    """The command's config, refused when ``--config-name`` names another trainer's (``hybridrl train`` given the
    SFT config, ``hybridrl sft`` given an RL one)."""
    config = load_from_args(args)
    RUN_IN_PROGRESS.update(run_dir=config.trainer.default_local_dir,
                           resume_mode=getattr(config.trainer, "resume_mode", "disable"))
    if not isinstance(config, schema):
        other = COMMAND_OF_SCHEMA.get(type(config).__name__, "?")
        raise ValueError(f"--config-name={args.config_name} is a config of `hybridrl {other}` "
                         f"({type(config).__name__}), not of `hybridrl {command_name}`; run `hybridrl {other} "
                         f"--config-name {args.config_name} ...`, or give a {schema.__name__} config")
    return config


@command("config", "compose and validate a config (with every check `train` runs before its workers: data rows, "
         "rewards, tokenizer), then print it and its batch plan")
def show_config(args: argparse.Namespace) -> int:
    from hybridrl.config import TrainConfig, config_to_yaml, critic_enabled
    from hybridrl.config.plan_report import batch_plan_report, job_plan_report
    from hybridrl.trainers.preflight import check_run_inputs

    report: list[str] = []
    config = load_from_args(args, translation_report=report)
    if not args.no_check_paths:  # what `hybridrl train` checks before its first worker, by the same code
        check_run_inputs(config)
    print(config_to_yaml(config), end="")
    if report:
        print("# ---- verl's layout: what each verl key became (docs/verl.md) ----")
        print("\n".join(f"# {line}" for line in report))
    print("# ---- derived (never written back into the config) ----")
    if isinstance(config, TrainConfig):
        print(batch_plan_report(config, include_critic=critic_enabled(config)))
    else:  # SFT, reward-model and DPO configs: no rollout, no critic
        print(job_plan_report(config, "pairs" if COMMAND_OF_SCHEMA.get(type(config).__name__) in ("rm", "dpo") else
                              "sequences"))
    return 0


def plan_options(parser: argparse.ArgumentParser) -> None:
    from hybridrl.planner.hardware import GPUS

    parser.add_argument("--gpu", default="a100-80", choices=sorted(GPUS), help="device type to plan for")
    parser.add_argument("--price-per-gpu-hour", type=float, default=None, help="for the cost estimate (any currency)")
    parser.add_argument("--efficiency", type=float, default=0.4, help="fraction of peak the job reaches (MFU)")
    parser.add_argument("--headroom", type=float, default=0.15, help="fraction of device memory kept free")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default trainer.total_training_steps)")
    parser.add_argument("--network", default=None,
                        help="link between nodes, per node: pcie, nvlink3, nvlink4, 1gbe, 10gbe, 25gbe, 100gbe, ib, "
                             "ib-ndr, or Gbit/s as a number (default 25gbe, stated as assumed)")
    parser.add_argument("--keep-layout", action="store_true",
                        help="search memory savers and micro-batches only, in the configured rollout TP size and "
                             "sharding")
    parser.add_argument("--node-link", default=None,
                        help="link between the GPUs of a node, the same choices (default: the GPU's, e.g. pcie for "
                             "a10g, nvlink3 for a100)")
    from hybridrl.planner.shape_flags import add_shape_flags

    add_shape_flags(parser)


@command("plan", "per-device memory, micro-batch, offload advice, time and cost of a job on a GPU type",
         arguments=plan_options)
def plan(args: argparse.Namespace) -> int:
    from hybridrl.planner import format_plan, gpu_spec, plan_job

    for name, value, ok, rule in (("--steps", args.steps, args.steps is None or args.steps >= 1, "a positive count"),
                                  ("--price-per-gpu-hour", args.price_per_gpu_hour,
                                   args.price_per_gpu_hour is None or args.price_per_gpu_hour >= 0, ">= 0"),
                                  ("--efficiency", args.efficiency, 0 < args.efficiency <= 1, "in (0, 1]"),
                                  ("--headroom", args.headroom, 0 <= args.headroom < 1, "in [0, 1)")):
        if not ok:
            raise ValueError(f"{name}={value}: must be {rule}")
    from hybridrl.planner.comm_plan import parse_link

    links = {name: None if value is None else parse_link(value)
             for name, value in (("network", args.network), ("node_link", args.node_link))}
    from hybridrl.planner.report import shapes_of
    from hybridrl.planner.shape_flags import shape_from_flags

    from hybridrl.planner.hardware import planned_dtype_overrides

    by_flags = shape_from_flags(args)
    args.overrides = planned_dtype_overrides(args.overrides, args.config_name, conf_dir=args.config_path,
                                             extra_dirs=args.config_dir or ())
    config = load_from_args(args, **({"check_paths": False} if by_flags else {}))  # no model to find on disk
    if type(config).__name__ != "TrainConfig":
        from hybridrl.planner.rm_report import plan_other_trainer

        return plan_other_trainer(config, args, by_flags, links)
    job = plan_job(config, gpu_spec(args.gpu), headroom=args.headroom, efficiency=args.efficiency,
                   price_per_gpu_hour=args.price_per_gpu_hour, total_steps=args.steps,
                   keep_layout=args.keep_layout, shapes=shapes_of(config, by_flags[0]) if by_flags else None, **links)
    if by_flags:
        print(f"model shape from flags: {by_flags[0].num_parameters() / 1e9:.2f} B parameters; assumed "
              + ("; ".join(by_flags[1]) or "nothing"))
    print(format_plan(job))
    return 0 if job.recommendation.fits else 1


@command("train", "run the RL trainer (PPO, GRPO, ...): hybridrl train model.path=... algorithm=grpo")
def train(args: argparse.Namespace) -> int:
    from hybridrl.config.schema import TrainConfig
    from hybridrl.trainers.rl_trainer import RLTrainer
    from hybridrl.utils.report import format_summary, plot_learning_curves, step_time_breakdown

    result = RLTrainer(load_for("train", args, TrainConfig)).fit()
    rows = result.metric_rows()  # from the run itself: metrics.jsonl exists only with the jsonl logger
    plot = plot_learning_curves(result.run_dir, rows)
    figures = {"steps": result.global_step, "run directory": str(result.run_dir), "learning curves": str(plot)}
    first = result.first_validation or {}
    figures.update({key: f"{first[key]:.4g} -> {value:.4g}" if key in first and first is not result.last_validation
                    else f"{value:.4g}" for key, value in (result.last_validation or {}).items()})
    print(format_summary("hybridrl train", figures, step_time_breakdown(rows)))
    return 0


@command("sft", "supervised fine-tuning (the warm start for RL): hybridrl sft model.path=...", "sft_trainer")
def sft(args: argparse.Namespace) -> int:
    from hybridrl.config.sft_schema import SFTConfig
    from hybridrl.trainers.sft_trainer import SFTTrainer

    result = SFTTrainer(load_for("sft", args, SFTConfig)).fit()
    print(f"hybridrl sft: {len(result.history)} steps; model exported to {result.export_dir}")
    return 0


@command("rm", "train a reward model on preference pairs (Bradley-Terry): hybridrl rm model.path=...", "rm_trainer")
def rm(args: argparse.Namespace) -> int:
    from hybridrl.config.rm_schema import RMConfig
    from hybridrl.trainers.rm_trainer import RMTrainer

    result = RMTrainer(load_for("rm", args, RMConfig)).fit()
    print(f"hybridrl rm: {result.global_step} steps{held_out_accuracy(result)}; reward model exported to "
          f"{result.export_dir}")
    return 0


@command("dpo", "preference optimisation on pairs (DPO, cDPO, IPO, SimPO, ORPO): hybridrl dpo model.path=...",
         "dpo_trainer")
def dpo(args: argparse.Namespace) -> int:
    from hybridrl.config.dpo_schema import DPOConfig
    from hybridrl.trainers.dpo_trainer import DPOTrainer

    result = DPOTrainer(load_for("dpo", args, DPOConfig)).fit()
    print(f"hybridrl dpo: {result.global_step} steps{held_out_accuracy(result)}; policy exported to "
          f"{result.export_dir}")
    return 0


def held_out_accuracy(result) -> str:
    """``; held-out accuracy A (step s) -> B (step t)`` of a pair trainer's validations (empty without any)."""
    if not result.validations:
        return ""
    (first_step, first), (last_step, last) = result.validations[0], result.validations[-1]
    return (f"; held-out accuracy {first['val/accuracy']:.3f} (step {first_step}) -> "
            f"{last['val/accuracy']:.3f} (step {last_step})")


@command("demo", "the main job: tiny model, SFT then GRPO on arithmetic, on CPU (overrides go to GRPO)", "demo_grpo")
def demo(args: argparse.Namespace) -> int:
    from hybridrl.demo import run_demo

    run_demo(args.overrides)
    return 0


@command("demo-agent", "the multi-turn demo: a calculator tool, SFT then GRPO with the agent loop, on CPU",
         "demo_agent_grpo")
def demo_agent(args: argparse.Namespace) -> int:
    from hybridrl.demo import AGENT, run_demo

    run_demo(args.overrides, demo=AGENT)
    return 0


@command("demo-vlm", "the vision demo: a tiny random Qwen2-VL learns the colour of drawn shapes with GRPO, on CPU",
         "demo_vlm_grpo")
def demo_vlm(args: argparse.Namespace) -> int:
    from hybridrl.demo import VISION, run_demo

    run_demo(args.overrides, demo=VISION)
    return 0


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a run directory, a checkpoints/global_step_<k> dir or a Hugging Face model dir")
    parser.add_argument("--data", action="append", metavar="FILE[,FILE]", default=[],
                        help="test set: parquet/JSONL rows in verl's layout, repeatable (default: the config's "
                             "held-out set)")
    parser.add_argument("--n", type=int, default=1, help="sampled responses per prompt for pass@k / maj@k (default 1: "
                                                         "the greedy validation pass only)")
    parser.add_argument("--k", action="append", metavar="K[,K]", default=[],
                        help="the k of pass@k and maj@k, e.g. --k 1,4,8 (default: 1 and n)")
    parser.add_argument("--temperature", type=float, default=None, help="of the sampled pass (default rollout's)")
    parser.add_argument("--top-p", type=float, default=None, help="of the sampled pass (default rollout's)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first LIMIT prompts only")
    parser.add_argument("--output", default=None, help="output directory (default <run>/eval/<data> or "
                                                       "runs/eval/<model>/<data>); an interrupted evaluation resumes")
    parser.add_argument("--overwrite", action="store_true", help="start afresh in --output")


def _comma_list(values: Sequence[str], option: str, kind: type) -> list:
    """``--k 1,4 --k 8`` → ``[1, 4, 8]``; ``ValueError`` naming the option for an item that is not a ``kind``."""
    items = [item.strip() for value in values for item in value.split(",") if item.strip()]
    try:
        return [kind(item) for item in items]
    except ValueError:
        raise ValueError(f"{option} {','.join(items)}: each item must be a{'n integer' if kind is int else ' path'}") \
            from None


@command("eval", "evaluate a checkpoint or model on a test set: pass@1 (greedy), pass@k and maj@k per data source: "
         "hybridrl eval RUN_DIR [--data test.parquet] [--n 8]",
         config_name="", arguments=_eval_arguments)  # no default: the run's own config.yaml, else ppo_trainer
def evaluate(args: argparse.Namespace) -> int:
    from hybridrl.modeling.model_builder import load_tokenizer
    from hybridrl.rewards.registry import check_data_sources
    from hybridrl.trainers.eval_source import (default_output_dir, eval_config, eval_dataset, model_directory,
                                               resolve_eval_source)
    from hybridrl.trainers.evaluator import EvalSettings, Evaluator

    ks, files = _comma_list(args.k, "--k", int), _comma_list(args.data, "--data", str)
    settings = EvalSettings(args.n, tuple(ks), args.temperature, args.top_p).checked()  # mistakes first
    source = resolve_eval_source(args.source)
    output = Path(args.output) if args.output else default_output_dir(source, files)
    model_dir = model_directory(source, output)
    config = eval_config(source, model_dir, args.overrides, args.config_name, config_path=args.config_path,
                         config_dirs=args.config_dir or (), check_paths=not args.no_check_paths)
    dataset = eval_dataset(config, load_tokenizer(config.model), files, args.limit)
    # every prompt's data_source needs a built-in scorer (unless a user's agent may score its episodes itself)
    if config.custom_reward_function.path is None and not config.rollout.multi_turn.agent:
        check_data_sources(sorted({prompt.data_source for prompt in dataset}))
    print(f"hybridrl eval: {source.describe()} on {len(dataset)} prompts ({dataset.name}) -> {output}",
          file=sys.stderr)
    report = Evaluator(config, dataset, settings, output, description=source.describe(),
                       overwrite=args.overwrite).run()
    print(report.table())
    print(f"\nresults: {report.results_path}\nper-prompt records: {report.samples_path} ({report.seconds:.0f} s)")
    return 0


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a run directory (its latest checkpoint) or a checkpoints/global_step_<k> dir")
    parser.add_argument("output_dir", help="new directory for the Hugging Face model (safetensors + tokenizer)")


@command("export", "write a checkpoint's policy as a Hugging Face directory: hybridrl export RUN_DIR OUT_DIR",
         None, arguments=_export_arguments)
def export(args: argparse.Namespace) -> int:
    from hybridrl.trainers.export import ExportError, export_checkpoint, resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(args.source)
        output = export_checkpoint(checkpoint, args.output_dir)
    except ExportError as error:
        print(f"hybridrl export: {error}", file=sys.stderr)
        return 2
    print(f"hybridrl export: {checkpoint} → {output} (load with transformers.AutoModelForCausalLM or vllm.LLM)")
    return 0


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a Hugging Face model directory, a run directory or a "
                                       "checkpoints/global_step_<k> dir (exported to a temporary directory first)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                                                             "needs --api-key)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    parser.add_argument("--api-key", default=None, help="bearer token every request must carry")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context length: prompt + reply (default: the model's positions, at most 2048)")
    parser.add_argument("--max-tokens", type=int, default=1024, help="most new tokens one request may ask (1024)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32", "float16"),
                        help="the engine's dtype (default auto: what `hybridrl train` resolves model.dtype=auto to "
                             "here — bfloat16 on a GPU or a CPU with native bf16, else float32; float16 on GPU only)")
    parser.add_argument("--served-model-name", default=None, help="the model name in responses (default: the "
                                                                  "directory's name)")


@command("serve", "serve a model or checkpoint behind an OpenAI-compatible API (chat, completions, tools), for your "
         "agent code: hybridrl serve RUN_OR_MODEL_DIR [--port 8000]", None, arguments=_serve_arguments)
def serve(args: argparse.Namespace) -> int:
    import tempfile

    from hybridrl.gateway.standalone import ServeSettings, serve_model
    from hybridrl.trainers.eval_source import model_directory, resolve_eval_source
    from hybridrl.utils.signals import stop_on_sigterm

    settings = ServeSettings(args.host, args.port, args.api_key, args.max_model_len, args.max_tokens, args.dtype,
                             args.served_model_name).checked()  # mistakes first
    source = resolve_eval_source(args.source)
    stop_on_sigterm()

    def ready(gateway) -> None:
        print(f"hybridrl serve: {source.describe()} at {gateway.base_url} (Ctrl-C stops)", flush=True)
    with tempfile.TemporaryDirectory(prefix="hybridrl-serve-") as scratch:
        try:
            serve_model(model_directory(source, Path(scratch)), settings, ready)
        except ImportError as error:
            print(f"hybridrl serve: {error}", file=sys.stderr)
            return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl", description=__doc__.splitlines()[0])
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, config_name, _) in COMMANDS.items():
        sub = subcommands.add_parser(name, help=help_text)
        if name in ARGUMENTS:  # first: a command's own positionals (eval's source) come before the overrides
            ARGUMENTS[name](sub)
        if config_name is not None:
            sub.add_argument("--config-name", default=config_name or None,
                             help="config to compose (a YAML file name without .yaml, built-in or in --config-dir)")
            sub.add_argument("--config-dir", action="append", metavar="DIR",
                             help="a directory of your own configs, searched before the built-in ones (repeatable); "
                                  "its YAML may name a built-in config in its defaults list")
            sub.add_argument("--config-path", metavar="DIR",
                             help="a directory replacing the built-in configs (default: the built-in conf/, "
                                  "or $HYBRIDRL_CONF_DIR)")
            sub.add_argument("--no-check-paths", action="store_true", help="skip file-existence checks")
            sub.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rollout.n=8 algorithm=gae")
    return parser


def parse_arguments(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, with overrides allowed after options too (``hybridrl eval RUN --n 8 rollout.n=2``: argparse
    alone takes one run of positionals, then refuses the rest)."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    late = [extra for extra in extras if "=" in extra and not extra.startswith("-")]
    if extras and (late != extras or not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    if late:
        args.overrides = [*args.overrides, *late]
    return args


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record, so lines pass through the live progress display's
    redirection instead of tearing it."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging() -> None:
    """hybridrl's own INFO lines (start-up decisions, restarts, sizing) on stderr; other libraries at WARNING."""
    root = logging.getLogger()
    if not any(isinstance(handler, _CurrentStderrHandler) for handler in root.handlers):
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("hybridrl").setLevel(logging.INFO)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_arguments(argv)
    configure_logging()
    _, _, handler = COMMANDS[args.command]
    if args.command in TRAINING_COMMANDS:
        _warn_if_interrupt_ignored(args.command)
    try:
        return handler(args)
    except KeyboardInterrupt as stop:  # the run's own clean-up (workers, Ray, partial checkpoints) ran on the way out
        terminated = isinstance(stop, TerminationRequested)
        print(f"hybridrl {args.command}: {'terminated (SIGTERM)' if terminated else 'interrupted'}"
              f"{_where_it_stopped()}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except _user_errors() as error:
        if os.environ.get("HYBRIDRL_TRACEBACK") or not str(error):
            raise
        hint = "" if isinstance(error, ConfigError) else "\n(set HYBRIDRL_TRACEBACK=1 to see where it was raised)"
        print(f"hybridrl {args.command}: {error}{hint}", file=sys.stderr)
        return 2


TRAINING_COMMANDS = ("train", "sft", "rm", "dpo", "demo", "demo-agent", "demo-vlm")


def _warn_if_interrupt_ignored(command: str) -> None:
    """A program started in the background by a non-interactive shell (``hybridrl train … &`` in a script) inherits
    SIGINT ignored: Ctrl-C would then not stop the run. Say so, and what does stop it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        logging.getLogger("hybridrl.cli").warning(
            "SIGINT is ignored in this process (started in the background by a non-interactive shell?): Ctrl-C "
            "will not stop `hybridrl %s`; `kill %d` (SIGTERM) does, after stopping the workers", command, os.getpid())


def _where_it_stopped() -> str:
    """``" at checkpoint …; resume with …"`` for a run that had a checkpoint, else what is there to know."""
    run_dir = RUN_IN_PROGRESS.get("run_dir")
    if run_dir is None:
        return ""
    from hybridrl.trainers.checkpoints import CheckpointManager

    latest = CheckpointManager(run_dir).latest()
    if latest is None:
        return f" (run directory {run_dir}: no checkpoint was written yet; the run starts afresh next time)"
    if RUN_IN_PROGRESS.get("resume_mode") != "auto":
        return (f"; the last checkpoint is {latest}; resume from it with trainer.resume_mode=resume_path "
                f"trainer.resume_from_path={latest}")
    return f"; the last checkpoint is {latest}; run the same command again to resume from it"


# Controller errors a user acts on (not bugs): looked up only if their module was loaded, since importing it here
# would import Ray for every command.
LATE_USER_ERRORS = (("hybridrl.runtime.errors", "ResourceUnavailableError"),
                    ("hybridrl.trainers.health", "TrainingHealthError"))


def _user_errors() -> tuple[type[Exception], ...]:
    loaded = tuple(getattr(sys.modules[module], name) for module, name in LATE_USER_ERRORS if module in sys.modules)
    return (ValueError, *loaded)


if __name__ == "__main__":
    sys.exit(main())

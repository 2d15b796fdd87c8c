"""The ``hybridrl`` command line: ``hybridrl <command> [--config-name NAME] [key=value ...]``.

Overrides use Hydra's syntax (``rollout.n=8``, ``algorithm=gae`` to pick a preset, ``+extra.x=1`` to add a key).
User mistakes print one clear message and exit with status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence

from hybridrl.config import ConfigError

COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help_text: str) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register a sub-command handler ``(args) -> exit status``."""

    def register(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (help_text, handler)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl", description=__doc__.splitlines()[0])
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        sub = subcommands.add_parser(name, help=help_text)
        sub.add_argument("--config-name", default="ppo_trainer", help="YAML file in conf/ (without .yaml)")
        sub.add_argument("--no-check-paths", action="store_true", help="skip file-existence checks")
        sub.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rollout.n=8 algorithm=gae")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _, handler = COMMANDS[args.command]
    try:
        return handler(args)
    except ConfigError as error:
        print(f"hybridrl {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

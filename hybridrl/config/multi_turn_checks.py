"""Checks of ``rollout.multi_turn``: the engine multi-turn episodes need, turns, tools, timeouts, the tool file.

The tool config file is read by ``hybridrl.agents.tool_config``, a layer above this one: it is named by import
path (as ``components.py`` names registries) and loaded only when the config is checked against this machine.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
from pathlib import Path

from hybridrl.config.components import registered_component
from hybridrl.config.checks import _choice, _require
from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig

BUILTIN_TOOL_NAMES = ("calculator", "python")  # agents.builtin_tools.BUILTIN_TOOLS
REWARD_PLACEMENTS = ("episode_end", "turn_end")
TOOL_CONFIG_LOADER = "hybridrl.agents.tool_config:load_tool_config"
AGENT_LOADER = "hybridrl.gateway.episodes:load_agent"
AGENT_PROBE_TIMEOUT_S = 120


def check_multi_turn(config: TrainConfig, error: ConfigError) -> None:
    """``rollout.multi_turn``: what does not depend on this machine's files (while it is off: no tools given)."""
    multi_turn = config.rollout.multi_turn
    if not multi_turn.agent:
        _check_agent_keys_without_agent(multi_turn, error)
    if not multi_turn.enable:
        _check_ignored_while_off(multi_turn, error)
        return
    engine = registered_component("rollout.name", config.rollout.name)
    if engine is not None and not getattr(engine, "serves_requests", False):  # an unknown name is refused elsewhere
        error.add("rollout.multi_turn.enable", True, f"multi-turn episodes run on an engine's request queue "
                  f"(rollout.base.RequestQueue), which rollout.name={config.rollout.name!r} does not have: set "
                  "rollout.name=vllm, or register an engine class with serves_requests = True")
    _require(error, "rollout.multi_turn.max_assistant_turns", multi_turn.max_assistant_turns,
             multi_turn.max_assistant_turns >= 1, "must be >= 1 (model turns per episode)")
    _require(error, "rollout.multi_turn.max_tool_calls_per_turn", multi_turn.max_tool_calls_per_turn,
             multi_turn.max_tool_calls_per_turn >= 1, "must be >= 1")
    _require(error, "rollout.multi_turn.env_step_timeout_s", multi_turn.env_step_timeout_s,
             multi_turn.env_step_timeout_s > 0, "must be > 0 (seconds)")
    for name in multi_turn.builtin_tools():
        _choice(error, "rollout.multi_turn.tools", name, BUILTIN_TOOL_NAMES)
    _choice(error, "rollout.multi_turn.tool_prompt", multi_turn.tool_prompt, ("template", "system"))
    _choice(error, "rollout.multi_turn.reward_placement", multi_turn.reward_placement, REWARD_PLACEMENTS)
    if multi_turn.agent:
        _check_agent_settings(multi_turn, error)
        _check_split_episodes(config, error)


def _check_agent_settings(multi_turn, error: ConfigError) -> None:
    """With an agent of the user's: its tools are its own, its limits are set."""
    for key, value in (("rollout.multi_turn.tools", multi_turn.tools),
                       ("rollout.multi_turn.tool_config_path", multi_turn.tool_config_path)):
        if value:
            error.add(key, value, f"is not read with rollout.multi_turn.agent={multi_turn.agent!r}: the agent "
                                  "offers its tools itself, in its requests (`tools=`); drop this key")
    _require(error, "rollout.multi_turn.agent_timeout_s", multi_turn.agent_timeout_s,
             0 < multi_turn.agent_timeout_s < math.inf, "must be a finite number > 0 (seconds per episode)")
    _require(error, "rollout.multi_turn.agent_concurrency", multi_turn.agent_concurrency,
             multi_turn.agent_concurrency >= 1, "must be >= 1 (episodes in flight at once)")
    _require(error, "rollout.multi_turn.agent_max_sequences", multi_turn.agent_max_sequences,
             multi_turn.agent_max_sequences >= 1, "must be >= 1 (training sequences per episode)")


SEQUENCE_ADVANTAGE_ESTIMATORS = ("grpo", "drgrpo", "rloo", "remax", "reinforce_plus_plus_baseline")
"""Estimators that give each sequence one advantage (with ``algorithm.use_kl_in_reward=false``): what an episode's
several sequences can share. Not REINFORCE++: its return restarts after every observation token."""


def _check_split_episodes(config: TrainConfig, error: ConfigError) -> None:
    """``agent_max_sequences > 1`` copies an episode's advantage to all its sequences: it must be one number."""
    multi_turn, algorithm = config.rollout.multi_turn, config.algorithm
    if multi_turn.agent_max_sequences <= 1:
        return
    key, why = "rollout.multi_turn.agent_max_sequences", "gives an episode's sequences its one advantage"
    if algorithm.adv_estimator not in SEQUENCE_ADVANTAGE_ESTIMATORS:
        error.add(key, multi_turn.agent_max_sequences,
                  f"{why}, and algorithm.adv_estimator={algorithm.adv_estimator} gives each token its own; use one "
                  f"of {', '.join(SEQUENCE_ADVANTAGE_ESTIMATORS)}, or set it to 1")
    if algorithm.use_kl_in_reward:
        error.add(key, multi_turn.agent_max_sequences,
                  f"{why}, and algorithm.use_kl_in_reward=true makes it depend on each sequence's tokens; use the KL "
                  "loss (actor.use_kl_loss=true) instead, or set it to 1")


def _check_agent_keys_without_agent(multi_turn, error: ConfigError) -> None:
    """Keys read only for a user's agent, set without one, would be ignored without a word: refused."""
    for key, value, default in (("agent_python", multi_turn.agent_python, None),
                                ("agent_max_sequences", multi_turn.agent_max_sequences, 1)):
        if value != default:
            error.add(f"rollout.multi_turn.{key}", value, "is read only with rollout.multi_turn.agent (your own "
                      "agent code); set the agent, or drop this key")


def _check_ignored_while_off(multi_turn, error: ConfigError) -> None:
    """Tools given while multi-turn is off would be ignored without a word: refused, naming the key."""
    for key, value, also in (("rollout.multi_turn.tool_config_path", multi_turn.tool_config_path,
                              " (verl's data.tool_config_path and actor_rollout_ref.rollout.multi_turn."
                              "tool_config_path land here)"),
                             ("rollout.multi_turn.tools", multi_turn.tools, "")):
        if value:
            error.add(key, value, f"is read only by multi-turn episodes, and rollout.multi_turn.enable=false{also}: "
                                  "set rollout.multi_turn.enable=true to give the model these tools, or drop this key")
    if multi_turn.agent:
        error.add("rollout.multi_turn.agent", multi_turn.agent, "runs only as multi-turn episodes, and "
                  "rollout.multi_turn.enable=false: set rollout.multi_turn.enable=true (with rollout=vllm or "
                  "rollout=vllm_cpu), or drop this key")


def check_tool_config(config: TrainConfig, error: ConfigError) -> None:
    """``rollout.multi_turn.tool_config_path``: the file loads (every entry's function or class imports, its schema
    is well formed), and its tool names do not repeat the built-in tools offered beside it."""
    multi_turn = config.rollout.multi_turn
    key, path = "rollout.multi_turn.tool_config_path", multi_turn.tool_config_path
    if not multi_turn.enable or not path:
        return
    module, attribute = TOOL_CONFIG_LOADER.split(":")
    try:
        tools = getattr(importlib.import_module(module), attribute)(path)
    except ValueError as failure:  # ToolConfigError: names the file, entry and field
        error.add(key, path, str(failure))
        return
    clashes = sorted({tool.name for tool in tools} & set(multi_turn.builtin_tools()))
    if clashes:
        error.add(key, path, f"its tool(s) {clashes} are also built-in tools in rollout.multi_turn.tools; "
                             "give them other names or drop them from rollout.multi_turn.tools")


def check_agent_function(config: TrainConfig, error: ConfigError) -> None:
    """``rollout.multi_turn.agent``: it imports, and is an ``async def`` taking ``(row, client)``."""
    multi_turn = config.rollout.multi_turn
    if not multi_turn.enable or not multi_turn.agent:
        return
    if multi_turn.agent_python:
        _check_agent_elsewhere(multi_turn, error)
        return
    module, attribute = AGENT_LOADER.split(":")
    try:
        getattr(importlib.import_module(module), attribute)(multi_turn.agent)
    except (ValueError, TypeError) as failure:
        error.add("rollout.multi_turn.agent", multi_turn.agent, str(failure))


def _check_agent_elsewhere(multi_turn, error: ConfigError) -> None:
    """``agent_python``: an interpreter that runs, imports hybridrl and loads the agent (checked there)."""
    python, key = multi_turn.agent_python, "rollout.multi_turn.agent_python"
    if not multi_turn.agent_process:
        error.add(key, python, "runs the agent process, and rollout.multi_turn.agent_process=false (agents on the "
                               "worker's own loop use the trainer's interpreter): set agent_process=true or drop it")
        return
    if not (Path(python).is_file() and os.access(python, os.X_OK)):
        error.add(key, python, "is not an executable file (give a virtual environment's bin/python)")
        return
    module, attribute = AGENT_LOADER.split(":")
    probe = (f"import sys\nfrom {module} import {attribute}\ntry:\n    {attribute}(sys.argv[1])\n"
             "except (ValueError, TypeError) as error:\n    sys.exit(str(error).split(': ', 1)[-1])")
    try:
        done = subprocess.run([python, "-c", probe, multi_turn.agent], capture_output=True, text=True,
                              timeout=AGENT_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        error.add(key, python, f"took over {AGENT_PROBE_TIMEOUT_S} s to load rollout.multi_turn.agent")
        return
    if done.returncode == 0:
        return
    last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    if "No module named 'hybridrl'" in last:
        error.add(key, python, "cannot import hybridrl: install it there too (`<that python> -m pip install "
                               "--no-deps hybridrl`, or `-e` a checkout)")
    else:
        error.add("rollout.multi_turn.agent", multi_turn.agent, f"does not load in {python}: {last}")


def resolved_file_name(name: str) -> str:
    """``file.py:function`` with the file's absolute path (workers may start elsewhere); other names as given."""
    module_part, separator, attribute = name.rpartition(":")
    if separator and module_part.endswith(".py"):
        return f"{Path(module_part).resolve()}:{attribute}"
    return name

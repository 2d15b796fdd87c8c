"""Multi-turn episodes on a rank's vLLM engine (``rollout.multi_turn.enable``): the worker's side of ``hybridrl.agents``.

One episode per response row (``rollout.n`` per prompt), all in flight together on the engine's request queue. A
row's environment is its ``agent_name`` (verl's per-row choice; kept in ``extra_info``) or
``rollout.multi_turn.environment``; the tools are the built-in ones and those of ``tool_config_path``;
its opening messages are the row's prompt as given (``messages``), rendered with the tools' schemas by the chat
template. Each episode is seeded from the call's seed and its row, so a fixed seed gives the same episodes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from hybridrl.agents.batch import out_of_groups, trajectories_to_batch
from hybridrl.agents.environment import ENVIRONMENTS, resolve_tools, unknown_row_tools
from hybridrl.agents.lockstep import LeaderRequests, ReplicaGroup, follow
from hybridrl.agents.loop import AgentLoop, LoopLimits
from hybridrl.agents.tool_config import load_tool_config
from hybridrl.agents.trajectory import ChatRenderer, supports_tools
from hybridrl.config.multi_turn_schema import MultiTurnConfig
from hybridrl.data.loader import DataFields
from hybridrl.gateway.agent_process import AgentProcess
from hybridrl.gateway.episodes import AgentPlayer, InProcess, load_agent
from hybridrl.gateway.training import AgentRun, play_agent_episodes
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.seeding import derive_seed


class ToolTemplateError(ValueError):
    """The chat template cannot show the model its tools."""


def no_reward(final_text: str, row: Any) -> float:
    """The tool environment's own reward: none — the row's reward function scores the final answer."""
    return 0.0


def episode_runner(config, tokenizer) -> "EpisodeRunner | None":
    """The runner when ``rollout.multi_turn.enable``, else ``None`` (single-turn generation)."""
    if not config.rollout.multi_turn.enable:
        return None
    return EpisodeRunner(config.rollout.multi_turn, tokenizer, config.data.max_prompt_length,
                         config.data.max_response_length)


SINGLE_TURN_AGENTS = ("single_turn", "single_turn_agent")
"""Row ``agent_name`` values that ask for what single-turn generation does anyway (multi-turn off)."""


def check_agent_names(config, dataset, tool_names: Optional[list[str]] = None) -> None:
    """Every prompt's ``agent_name`` in ``dataset`` (a ``PromptDataset``) can be honoured, before any worker starts:
    with ``rollout.multi_turn.enable`` it names a registered environment, and the tools its
    ``extra_info.tools_kwargs`` gives arguments to are among ``tool_names`` (the built-in tools and those of the
    tool file); without, it asks for no multi-turn episode. A ``ValueError`` names the file and row of the first
    row that fails (and how many do)."""
    if not config.rollout.multi_turn.enable:
        _refuse_first(dataset, lambda prompt: _agent_without_multi_turn(prompt.extra_info.get("agent_name")))
        return
    _refuse_first(dataset, lambda prompt: _row_agent_problem(prompt, config.rollout.multi_turn, tool_names))


def _refuse_first(dataset, problem_of) -> None:
    problems = [(prompt, problem) for prompt in dataset if (problem := problem_of(prompt))]
    if problems:
        prompt, problem = problems[0]
        where = prompt.where or f"the {dataset.name} data, row {prompt.row_id}"
        others = f" ({len(problems) - 1} more row(s) of the {dataset.name} data alike)" if len(problems) > 1 else ""
        raise ValueError(f"{where}: {problem}{others}")


def _agent_without_multi_turn(name: object) -> Optional[str]:
    if name is None or name in SINGLE_TURN_AGENTS:
        return None
    return (f"agent_name={name!r} asks for a multi-turn episode, and rollout.multi_turn.enable=false (one turn, no "
            "tools: the column would be ignored); set rollout.multi_turn.enable=true (with rollout=vllm or "
            "rollout=vllm_cpu, and the tools in rollout.multi_turn.tool_config_path), or drop the agent_name "
            f"column (or set it to {SINGLE_TURN_AGENTS[1]!r})")


def _row_agent_problem(prompt, multi_turn: MultiTurnConfig, tool_names: Optional[list[str]]) -> Optional[str]:
    name = prompt.extra_info.get("agent_name")
    if name is not None and name not in ENVIRONMENTS:
        return _unknown_environment(name)
    if tool_names is None:
        return None
    unknown = unknown_row_tools({"extra_info": prompt.extra_info}, tool_names)
    if unknown:
        return (f"extra_info.tools_kwargs names the tool(s) {unknown}, which rollout.multi_turn does not define "
                f"(its tools: {', '.join(sorted(tool_names)) or 'none'}; from rollout.multi_turn.tools and "
                f"{multi_turn.tool_config_path or 'no rollout.multi_turn.tool_config_path'}); their create_kwargs "
                "would reach no tool: fix the tool name in the row or add the tool to the tool file")
    return None


def _unknown_environment(name: object) -> str:
    return (f"agent_name {name!r} names no environment; registered: {', '.join(ENVIRONMENTS.names())} (register "
            "yours in a trainer.plugins file)")


def _agent_player(multi_turn: MultiTurnConfig) -> AgentPlayer:
    """Where ``rollout.multi_turn.agent`` plays: a process of its own, or this worker's event loop."""
    if multi_turn.agent_process:
        return AgentProcess(multi_turn.agent, python=multi_turn.agent_python)
    return InProcess(load_agent(multi_turn.agent))


def engine_context_length(config, episodes: "EpisodeRunner | None") -> int:
    """The engine's ``max_model_len``: prompt + response, plus the tools' rendering in multi-turn prompts."""
    extra = episodes.prompt_overhead if episodes is not None else 0
    return config.data.max_prompt_length + config.data.max_response_length + extra


class EpisodeRunner:
    """Builds what every call shares (tools, renderer) once per worker.

    Args:
        multi_turn: ``rollout.multi_turn``.
        tokenizer: the policy's tokenizer (its chat template renders tools and observations).
        max_prompt_length: ``data.max_prompt_length`` (episode prompts are padded to it plus the tools' rendering).
        max_response_length: ``data.max_response_length`` (with the prompt: the engine's context for an agent).
    """

    def __init__(self, multi_turn: MultiTurnConfig, tokenizer, max_prompt_length: int = 0,
                 max_response_length: int = 0) -> None:
        self.config, self.tokenizer = multi_turn, tokenizer
        self.agent_run = AgentRun(_agent_player(multi_turn), multi_turn.agent_timeout_s,
                                  multi_turn.agent_concurrency, max_prompt_length,
                                  multi_turn.agent_max_sequences) if multi_turn.agent else None
        """A user's agent (``rollout.multi_turn.agent``), played through a gateway; ``None``: the environments."""
        self.max_model_len = max_prompt_length + max_response_length
        self.tools = [*resolve_tools(multi_turn.builtin_tools()),
                      *(load_tool_config(multi_turn.tool_config_path) if multi_turn.tool_config_path else [])]
        schemas = [tool.schema() for tool in self.tools]
        in_system = multi_turn.tool_prompt == "system"
        if schemas and not in_system and not supports_tools(tokenizer, schemas):
            raise ToolTemplateError(
                "rollout.multi_turn.tools: the model's chat template ignores the `tools` it is given, so the model "
                "would never see them; set rollout.multi_turn.tool_prompt=system (hybridrl describes the tools in "
                "a system message), or use a tokenizer whose chat template renders tools (model.tokenizer_path)")
        self.renderer = ChatRenderer(tokenizer, schemas, strict=multi_turn.strict, tools_in_system=in_system)
        probe = [{"role": "user", "content": "x"}]
        overhead = len(self.renderer.prompt_ids(probe)) - len(ChatRenderer(tokenizer).prompt_ids(probe))
        self.prompt_overhead = max(overhead, 0)
        """Ids the tools' rendering adds to a prompt (the engine's context is longer by this much)."""
        self.prompt_width = max_prompt_length + self.prompt_overhead if max_prompt_length else 0
        """Every rank pads episode prompts to this width (``data.max_prompt_length`` + the tools' rendering)."""

    def run(self, engine, prompts: Batch, params: SamplingParams,
            replica: Optional[ReplicaGroup] = None) -> Optional[Batch]:
        """``B`` prompts → ``B·n`` episode rows (``agents/batch.py`` layout) on ``engine`` (one whose class serves
        requests: ``requests``, ``eos_token_ids``, ``pad_token_id``); each episode's response budget (model and
        observation ids together) is ``params.max_new_tokens``.

        ``replica``: this rank is one of a tensor-parallel replica's ranks. Its leader runs the episodes (their
        environments and tools: once per replica) and mirrors every request to the others, which only follow the
        leader's engine calls and return ``None`` (``agents/lockstep.py``)."""
        if replica is not None and not replica.is_leader:
            follow(engine.requests, replica)
            return None
        copies = params.n
        rows = prompts.repeat_interleave(copies)
        sources = rows[DataFields.DATA_SOURCE] if DataFields.DATA_SOURCE in rows else [None] * len(rows)
        row_dicts = [{"prompt": rows[DataFields.MESSAGES][index], "ground_truth": rows[DataFields.GROUND_TRUTH][index],
                      "extra_info": rows[DataFields.EXTRA_INFO][index], "data_source": sources[index]}
                     for index in range(len(rows))]
        requests = LeaderRequests(engine.requests, replica) if replica is not None else engine.requests
        try:
            trajectories = self._play(engine, requests, row_dicts, params)
        finally:
            if replica is not None:
                requests.finish()
        for index, trajectory in enumerate(trajectories):
            if not trajectory.prompt_ids:  # reset() failed: keep the row's own prompt, so the row stays well-formed
                mask = rows[Fields.ATTENTION_MASK][index].bool()
                trajectory.prompt_ids = rows[Fields.INPUT_IDS][index][mask].tolist()
        batch = trajectories_to_batch(trajectories, rows, params.max_new_tokens, engine.pad_token_id,
                                      self.prompt_width, turn_rewards=self.config.reward_placement == "turn_end",
                                      agent_rewards=self.agent_run is not None)
        return out_of_groups(batch) if self.agent_run is not None else batch

    def _play(self, engine, requests, row_dicts: list[dict], params: SamplingParams) -> list:
        """One trajectory per row: the user's agent through a gateway, or the rows' environments."""
        if self.agent_run is not None:
            return play_agent_episodes(requests, self.tokenizer, engine.eos_token_ids, self.max_model_len,
                                       self.agent_run, row_dicts, replace(params, n=1),
                                       version=lambda: engine.policy_version)
        environments = [ENVIRONMENTS[self._environment_name(row)](self.tools, no_reward,
                                                                  self.config.max_tool_calls_per_turn)
                        for row in row_dicts]
        episode_params = [replace(params, n=1, seed=None if params.seed is None else
                                  derive_seed(params.seed, "episode", index)) for index in range(len(row_dicts))]
        limits = LoopLimits(max_assistant_turns=self.config.max_assistant_turns,
                            max_response_tokens=params.max_new_tokens, env_step_timeout_s=self.config.env_step_timeout_s)
        loop = AgentLoop(requests, self.renderer, limits, stop_ids=engine.eos_token_ids,
                         version=lambda: engine.policy_version)
        return loop.run(environments, row_dicts, episode_params)

    def _environment_name(self, row: dict) -> str:
        """The row's ``agent_name`` (a data column, kept in ``extra_info``), else ``rollout.multi_turn.environment``;
        an unknown name fails the run here, naming the registered ones (a data error, not an episode's)."""
        extra = row.get("extra_info")
        name = extra.get("agent_name") if isinstance(extra, dict) else None
        name = str(name) if name else self.config.environment
        if name not in ENVIRONMENTS:
            raise ValueError(f"a row: {_unknown_environment(name)}")
        return name

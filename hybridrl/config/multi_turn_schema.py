"""``rollout.multi_turn``: multi-turn agent episodes (``hybridrl/agents``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridrl.config.frozen import FreezableConfig


@dataclass
class MultiTurnConfig(FreezableConfig):
    enable: bool = False
    """Generate multi-turn episodes (tool calls, environments) instead of one response per prompt: each turn's ids
    are trained exactly as sampled; tool / environment tokens take no loss (``hybridrl/agents``). Needs
    an engine with a request queue: ``rollout.name=vllm`` (``rollout.base.RequestQueue``)."""
    environment: str = "tool"
    """Registered environment for rows without an ``agent_name`` column: ``tool`` (the built-in tool caller) or a
    name registered with ``hybridrl.agents.environment.ENVIRONMENTS`` in a ``trainer.plugins`` file."""
    tools: Optional[list[str]] = None
    """Built-in tools the ``tool`` environment offers: ``calculator`` (safe arithmetic), ``python`` (sandboxed
    subprocess). ``null`` (default): ``[calculator]``, or none when ``tool_config_path`` gives the tools."""
    tool_config_path: Optional[str] = None
    """A tool config file in verl's format (``tools: [{class_name, config, tool_schema}]``; verl's files load
    unchanged): each ``class_name`` is your function or class (``module.Name``, ``module:Name``, ``file.py:Name``)
    or one of verl's classes hybridrl has an equivalent of (``Gsm8kTool``, ``SandboxFusionTool`` — run locally); a
    row's ``extra_info.tools_kwargs.<tool>.create_kwargs`` reach its tool (``hybridrl/agents/tool_config.py``)."""
    max_assistant_turns: int = 4
    """Model turns per episode (verl's name); the episode ends after this many even without a final answer."""
    max_tool_calls_per_turn: int = 4
    """Tool calls answered in one model turn; further calls get an error message (counted)."""
    env_step_timeout_s: float = 30.0
    """Longest an environment may take to answer one turn; past it the episode ends as a counted failure."""
    tool_prompt: str = "template"
    """How the model sees the tools: ``template`` (the chat template renders the ``tools`` list; refused at start if
    it ignores them) or ``system`` (hybridrl describes them and the Hermes call format in a system message: for
    templates without tool support, e.g. SmolLM2's)."""
    reward_placement: str = "episode_end"
    """Where an environment's per-turn rewards (a tool's ``ToolResult.reward``, a step's ``reward``) go:
    ``episode_end`` (summed on the episode's last model token, with the final answer's score) or ``turn_end`` (each
    on the last token of the model turn it answered: per-turn credit for GAE; group estimators sum them anyway)."""
    agent: Optional[str] = None
    """Your own agent code instead of an environment: ``module:function`` or ``file.py:function`` naming
    ``async def agent(row, client) -> float | AgentResult | None``. Each episode calls it with its data row
    (``prompt`` messages, ``ground_truth``, ``extra_info``, ``data_source``) and an ``openai.AsyncOpenAI`` client on
    a session of a gateway over this replica; every call is captured token for token and trained as sampled
    (``hybridrl/gateway``). It returns the episode's reward, or ``None`` to have the data source's reward function
    score its last reply. The agent brings its own tools (``tools``, ``tool_config_path``, ``environment``,
    ``max_assistant_turns``, ``tool_prompt``, ``reward_placement`` and ``strict`` are not read: template
    mismatches are counted); the gateway samples with
    ``rollout``'s settings (temperature, top-p …) whatever a request asks, the episode's first prompt may be
    ``data.max_prompt_length`` ids and all its replies and tool results ``data.max_response_length``."""
    agent_timeout_s: float = 600.0
    """Longest one agent episode may run (seconds); past it the episode is cancelled and counted as failed."""
    agent_concurrency: int = 256
    """Agent episodes in flight at once on one replica."""
    agent_process: bool = True
    """Play the agent's episodes in a process of its own per replica (started once, kept): the agents' Python runs
    beside the engine rather than taking turns with it, and an agent that blocks its event loop or crashes fails
    its batch's episodes (each saying why), not the worker. ``false``: on the replica worker's own event loop (a
    debugger's breakpoints in your agent work there)."""
    agent_python: Optional[str] = None
    """The Python interpreter of the agent process: another virtual environment's ``bin/python``, for an agent whose
    libraries cannot share the trainer's (``verifiers`` pins ``openai<3``, vLLM needs ``openai>=3``). hybridrl must
    be installed there too (``pip install --no-deps hybridrl``); the agent is checked there at start. ``null``: the
    trainer's own interpreter. Needs ``agent_process=true``."""
    agent_max_sequences: int = 1
    """Training sequences kept per agent episode. An episode whose calls do not all extend one conversation (an
    agent that edits or summarises its context) is several sequences, never re-tokenised into one; each episode
    then trains up to this many of them — the one holding its last call and the latest others — all with the
    episode's one advantage (computed once per episode, so group statistics see each episode once). Each episode
    takes this many rows of the step (``rollout.n`` × this per prompt in the batch sizes; unused rows hold no
    token in the loss). Sequences past it are counted (``agent/dropped_sequences``), not trained. Needs an
    estimator that gives a sequence one advantage (``grpo``, ``drgrpo``, ``rloo``, ``remax``,
    ``reinforce_plus_plus_baseline``) and ``algorithm.use_kl_in_reward=false``. With a ``seq-mean-*``
    ``actor.loss_agg_mode`` each sequence counts once, so a split episode weighs as many sequences as it trains."""
    strict: bool = False
    """Stop the run when the chat template does not reproduce the ids generated so far (else: counted in
    ``agent/prefix_mismatches``, the ids kept as generated)."""

    def builtin_tools(self) -> list[str]:
        """The built-in tools offered: ``tools``, or its default (``[calculator]`` unless a tool config file or an
        agent)."""
        if self.tools is not None:
            return list(self.tools)
        return [] if self.tool_config_path or self.agent else ["calculator"]

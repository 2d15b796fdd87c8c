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
    strict: bool = False
    """Stop the run when the chat template does not reproduce the ids generated so far (else: counted in
    ``agent/prefix_mismatches``, the ids kept as generated)."""

    def builtin_tools(self) -> list[str]:
        """The built-in tools offered: ``tools``, or its default (``[calculator]`` unless a tool config file)."""
        if self.tools is not None:
            return list(self.tools)
        return [] if self.tool_config_path else ["calculator"]

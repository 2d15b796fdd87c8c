"""``rollout.multi_turn``: multi-turn agent episodes (``hybridrl/agents``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridrl.config.frozen import FreezableConfig


@dataclass
class MultiTurnConfig(FreezableConfig):
    enable: bool = False
    """Generate multi-turn episodes (tool calls, environments) instead of one response per prompt: each turn's ids
    are trained exactly as sampled; tool / environment tokens take no loss (``hybridrl/agents``). Needs
    ``rollout.name=vllm`` (the request API)."""
    environment: str = "tool"
    """Registered environment for rows without an ``agent_name`` column: ``tool`` (the built-in tool caller) or a
    name registered with ``hybridrl.agents.environment.ENVIRONMENTS`` in a ``trainer.plugins`` file."""
    tools: list[str] = field(default_factory=lambda: ["calculator"])
    """Tools the ``tool`` environment offers: ``calculator`` (safe arithmetic), ``python`` (sandboxed subprocess)."""
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
    strict: bool = False
    """Stop the run when the chat template does not reproduce the ids generated so far (else: counted in
    ``agent/prefix_mismatches``, the ids kept as generated)."""

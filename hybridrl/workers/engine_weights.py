"""The actor worker's record of which weights its rollout engine holds, and the checked sync that moves them.

An engine that holds its own copy of the weights (vLLM) generates from whatever was last loaded into it. Two silent
failures follow: a sync that never ran (the engine samples from an old policy while the trainer computes ratios
against the new one), and a sync whose bytes were damaged or misplaced on the way. :class:`EngineWeights` guards
against both:

- **versions**: the engine's weights are labelled with the trainer's ``policy_version`` (docs/concepts.md, "One
  policy version"), given with each sync. Every change of the actor's weights (an update, an SFT step, a checkpoint
  load) marks the engine's copy stale until the next sync; :meth:`require_current`, called before every generation,
  refuses to generate from weights the actor no longer has, naming the version the engine holds.
- **checksums** (``rollout.verify_weight_sync``): the resharder fingerprints every piece before it moves and every
  slice as it reaches the engine, and :meth:`sync` compares them (``hybrid_engine/checksums.py``); a mismatch stops
  the run naming the parameter.
"""

from __future__ import annotations

from typing import Optional

from hybridrl.hybrid_engine import WeightResharder


class StaleEngineWeightsError(RuntimeError):
    """Generation was asked of an engine whose weights are older than the actor's."""


class EngineWeights:
    """Versions and the checked sync of one rank's engine copy.

    Args:
        resharder: streams this rank's slices of the actor's weights (``None``: the engine generates with the
            actor's own module, so it is always current).
        verify: compare fingerprints after each sync (``rollout.verify_weight_sync``).
        loaded_current: whether the engine starts with the actor's weights (it loaded the same ``model.path``);
            ``False`` for ``rollout.load_format=dummy``, whose random start must be synced before it generates.
    """

    def __init__(self, resharder: Optional[WeightResharder], *, verify: bool, loaded_current: bool) -> None:
        self.resharder, self.verify = resharder, verify
        self.policy_version: Optional[int] = 0 if loaded_current or resharder is None else None  # None: random
        self.stale = self.policy_version is None

    def actor_changed(self) -> None:
        """The actor's weights changed (optimizer step, checkpoint load): the engine's copy is now stale."""
        self.stale = self.resharder is not None

    def require_current(self) -> None:
        """Raise :class:`StaleEngineWeightsError` unless the engine holds the actor's current weights."""
        if self.stale:
            held = "random weights (rollout.load_format=dummy)" if self.policy_version is None else \
                f"the weights of version {self.policy_version}"
            raise StaleEngineWeightsError(
                f"the rollout engine holds {held} but the actor's weights have changed since: a weight sync "
                "was skipped; call sync_rollout_weights after every change of the actor's weights")

    def relabel(self, policy_version: int) -> None:
        """The trainer moved on without changing the actor's weights (``trainer.critic_warmup``): the engine's
        current weights are now those of ``policy_version``."""
        self.require_current()
        self.policy_version = policy_version

    def sync(self, engine, policy_version: Optional[int] = None) -> None:
        """Stream the actor's weights into ``engine`` (collective over the actor's ranks), checked if ``verify``, as
        the weights of ``policy_version`` (``None``: one more than the engine held)."""
        assert self.resharder is not None
        tensor_parallel = self.resharder.plan.layout.tp_size > 1
        stream = (self.resharder.stream_full_shaped(self.verify) if tensor_parallel
                  else self.resharder.stream(self.verify))
        if policy_version is None:
            policy_version = 1 + (self.policy_version or 0)
        engine.update_weights(stream, policy_version=policy_version)
        if self.verify:
            self.resharder.verify()
        self.policy_version, self.stale = policy_version, False

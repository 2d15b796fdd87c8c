"""The actor worker's record of which weights its rollout engine holds, and the checked sync that moves them.

An engine that holds its own copy of the weights (vLLM) generates from whatever was last loaded into it. Two silent
failures follow: a sync that never ran (the engine samples from an old policy while the trainer computes ratios
against the new one), and a sync whose bytes were damaged or misplaced on the way. :class:`EngineWeights` guards
against both:

- **versions**: every change of the actor's weights (an update, an SFT step, a checkpoint load) bumps
  ``actor_version``; a sync sets ``engine_version`` to it. :meth:`require_current`, called before every
  generation, refuses to generate from weights the actor no longer has, naming both versions.
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
        self.actor_version = 0
        self.engine_version: Optional[int] = 0 if loaded_current or resharder is None else None

    def actor_changed(self) -> None:
        """The actor's weights changed (optimizer step, checkpoint load): the engine's copy is now stale."""
        self.actor_version += 1
        if self.resharder is None:
            self.engine_version = self.actor_version

    def require_current(self) -> None:
        """Raise :class:`StaleEngineWeightsError` unless the engine holds the actor's current weights."""
        if self.engine_version != self.actor_version:
            held = "random weights (rollout.load_format=dummy)" if self.engine_version is None else \
                f"the weights of version {self.engine_version}"
            raise StaleEngineWeightsError(
                f"the rollout engine holds {held} but the actor is at version {self.actor_version}: a weight sync "
                "was skipped; call sync_rollout_weights after every change of the actor's weights")

    def sync(self, engine) -> None:
        """Stream the actor's weights into ``engine`` (collective over the actor's ranks), checked if ``verify``."""
        assert self.resharder is not None
        tensor_parallel = self.resharder.plan.layout.tp_size > 1
        stream = (self.resharder.stream_full_shaped(self.verify) if tensor_parallel
                  else self.resharder.stream(self.verify))
        engine.update_weights(stream)
        if self.verify:
            self.resharder.verify()
        self.engine_version = self.actor_version

"""Checkpoint methods shared by the workers whose trained state is one engine (``self.engine`` with ``model``,
``optimizer`` and ``scheduler``): the critic and the reward-model trainer."""

from __future__ import annotations

from hybridrl.runtime import one_to_all
from hybridrl.engines.checkpoint import load_sharded, save_sharded


class EngineCheckpoints:
    """Mixin for a ``Worker``: ``save_checkpoint`` / ``load_checkpoint`` of ``self.engine``'s model, optimizer and
    scheduler (every rank writes and reads its own shards; the DP size may differ on load)."""

    @one_to_all(collect="first")
    def save_checkpoint(self, directory: str) -> str:
        """Model, optimizer, scheduler and RNG states under ``directory`` (every rank writes its shards)."""
        save_sharded(directory, self.engine.model, self.engine.optimizer, self.engine.scheduler)
        return directory

    @one_to_all(collect="first")
    def load_checkpoint(self, directory: str) -> str:
        """Restore what ``save_checkpoint`` wrote (the DP size may differ)."""
        load_sharded(directory, self.engine.model, self.engine.optimizer, self.engine.scheduler)
        return directory

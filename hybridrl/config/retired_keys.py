"""Config keys that were replaced, and what to write instead: a run that still sets one is refused with its
replacement named (``hybridrl.config.loader``), never silently ignored."""

from __future__ import annotations

from typing import Optional

RETIRED_KEYS = {
    "rollout.weight_sync_method": "replaced by rollout.weight_transfer, one key for every placement (its 'shared' "
                                  "is now shared_memory; auto, plan and gather are unchanged)",
    "rollout.weight_transport": "replaced by rollout.weight_transfer, one key for every placement (the same values: "
                                "auto, shared_memory, object_store, collective)",
    "rollout.weight_transport_timeout_s": "replaced by rollout.weight_transfer_timeout_s",
}


def retired_key_message(dotted_key: str) -> Optional[str]:
    """What replaced ``dotted_key`` (``None`` when it was never a key)."""
    return RETIRED_KEYS.get(dotted_key)

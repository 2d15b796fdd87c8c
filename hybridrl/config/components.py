"""Config keys whose value names a component that a registry above this layer owns.

The registries live with their components — advantage estimators and policy losses in :mod:`hybridrl.algorithms`,
rollout engines in :mod:`hybridrl.rollout` — and recipes add to them (``@ADVANTAGE_ESTIMATORS.register("mine")``
in a file listed in ``trainer.plugins``). The config layer cannot import those packages (they import it), so it
names each registry by its import path, the way Hydra names a ``_target_``, and resolves the path only when it
validates. There is no second list of names to drift from a registry: what is registered is what is accepted.
"""

from __future__ import annotations

import importlib

COMPONENT_REGISTRIES: dict[str, str] = {
    "algorithm.adv_estimator": "hybridrl.algorithms:ADVANTAGE_ESTIMATORS",
    "actor.policy_loss": "hybridrl.algorithms:POLICY_LOSSES",
    "actor.loss_agg_mode": "hybridrl.algorithms:LOSS_AGG_MODES",
    "critic.loss_agg_mode": "hybridrl.algorithms:LOSS_AGG_MODES",
    "actor.kl_loss_type": "hybridrl.algorithms:KL_PENALTY_KINDS",
    "algorithm.kl_penalty": "hybridrl.algorithms:KL_PENALTY_KINDS",
    "algorithm.kl_ctrl.type": "hybridrl.algorithms:KL_CONTROLLER_KINDS",
    "rollout.name": "hybridrl.rollout:ROLLOUT_ENGINES",
    "rollout.multi_turn.environment": "hybridrl.agents.environment:ENVIRONMENTS",
}
"""``config key -> "module:attribute"`` of the registry (or tuple of names) its value must be in."""

NAMED_REGISTRIES: dict[str, str] = {
    **COMPONENT_REGISTRIES,
    "algorithm.filter_groups.metric": "hybridrl.trainers.variants:GROUP_FILTERS",
}
"""Every registry a key's value is looked up in: those of :data:`COMPONENT_REGISTRIES` (the value must be there) and
``algorithm.filter_groups.metric``'s (a name there, or a value the reward function returns: checked by its
validator)."""


def _registry(key: str):
    module, attribute = NAMED_REGISTRIES[key].split(":")
    return getattr(importlib.import_module(module), attribute)


def registered_names(key: str) -> tuple[str, ...]:
    """The names ``key``'s registry holds now (recipes' registrations included)."""
    return tuple(_registry(key))


def registered_component(key: str, name: str) -> object:
    """The component registered as ``name`` in ``key``'s registry (``None`` when there is none of that name)."""
    registry = _registry(key)
    return registry[name] if name in registry else None


def value_at(config: object, key: str) -> object:
    """``config``'s value at dotted ``key`` (``"actor.policy_loss"`` → ``config.actor.policy_loss``)."""
    for part in key.split("."):
        config = getattr(config, part)
    return config

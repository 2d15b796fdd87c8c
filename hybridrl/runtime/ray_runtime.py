"""Ray start-up, owned by hybridrl: a private local instance by default, or attachment to a running cluster.

Ray reads some settings when it is imported and passes its environment to the processes it starts, so the variables
below are set (as defaults a user's own environment overrides) when this module is imported — before any
``import ray`` in hybridrl. ``hybridrl.runtime`` imports this module first.

- ``RAY_AUTH_MODE=disabled``: Ray 2.60 otherwise turns token authentication on and writes a token file.
- ``RAY_USAGE_STATS_ENABLED=0``: no usage reporting.
- ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: keeps a local instance on 127.0.0.1 instead of the machine's interface.
"""

from __future__ import annotations

import os
import sys

RAY_ENV_DEFAULTS = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


def apply_ray_env_defaults() -> None:
    """Set hybridrl's Ray environment defaults where the user has not set them."""
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


# Ray reads some of these when it is imported (the node address, for one): too late if it was imported already.
_RAY_IMPORTED_FIRST = "ray" in sys.modules and any(key not in os.environ for key in RAY_ENV_DEFAULTS)
apply_ray_env_defaults()

import logging  # noqa: E402
import socket  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Optional  # noqa: E402

import ray  # noqa: E402

from hybridrl.config.ray import RayConfig  # noqa: E402
from hybridrl.utils.signals import stop_on_sigterm  # noqa: E402

logger = logging.getLogger(__name__)


@dataclass
class RayRuntime:
    """The controller's handle on Ray. ``owns_ray``: this runtime called ``ray.init`` and will call ``ray.shutdown``.

    In local mode (``config.local_mode``) Ray is not started at all; pools and groups made from this runtime run
    their workers in the controller process.
    """

    config: RayConfig
    owns_ray: bool = False

    @property
    def local_mode(self) -> bool:
        return self.config.local_mode

    def shutdown(self) -> None:
        """Stop Ray if this runtime started it (idempotent); the worker processes parked for a next group end with
        it."""
        if self.owns_ray and ray.is_initialized():
            from hybridrl.runtime.parked import PARKED

            PARKED.forget()
            ray.shutdown()
        self.owns_ray = False

    def __enter__(self) -> RayRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def start_ray(config: Optional[RayConfig] = None) -> RayRuntime:
    """Validate ``config`` and bring Ray up (or reuse an already initialised Ray in this process).

    ``address="local"`` starts a private instance bounded by ``num_cpus``/``num_gpus``/``object_store_memory_mb``;
    any other address attaches to that cluster. ``local_mode=True`` starts nothing.
    """
    config = config or RayConfig()
    config.validate()
    if config.local_mode:
        return RayRuntime(config, owns_ray=False)
    apply_ray_env_defaults()
    if _RAY_IMPORTED_FIRST:
        logger.warning("ray was imported before hybridrl.runtime, so some of %s may not apply (e.g. the local "
                       "instance may advertise a network address instead of 127.0.0.1); import hybridrl.runtime "
                       "first or export them", ", ".join(RAY_ENV_DEFAULTS))
    if config.address == "local":
        _bind_local_instance_to_loopback()
    if ray.is_initialized():
        if ray_init_kwargs(config) != _started_with:  # not the instance this process started with these settings
            logger.warning("Ray is already initialised in this process; reusing it (trainer.ray start-up settings "
                           "unused)")
        return RayRuntime(config, owns_ray=False)
    check_reachable(config.address)
    try:
        ray.init(**ray_init_kwargs(config))
    except ConnectionError as error:  # address=auto with no cluster running, or a cluster that went away
        raise ValueError(f"trainer.ray.address={config.address!r}: cannot connect to a Ray cluster: {error}") from None
    _started_with.clear()
    _started_with.update(ray_init_kwargs(config))
    stop_on_sigterm()  # after ray.init, which installs its own (an exit that skips the workers' clean-up)
    return RayRuntime(config, owns_ray=True)


_started_with: dict[str, Any] = {}
"""The ``ray.init`` arguments of the instance this process started last: a later ``start_ray`` with the same settings
(``hybridrl demo``'s GRPO stage after its SFT stage) reuses it without a word."""


def _bind_local_instance_to_loopback() -> None:
    """Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when it is imported, and otherwise has its servers listen
    on every interface. If ``ray`` was imported before this module, apply the value now (a private constant: this
    is the one place hybridrl touches it; tested in tests/reliability/test_ray_local_only.py)."""
    from ray._private import ray_constants

    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0" and hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        ray_constants.ENABLE_RAY_CLUSTER = False


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """For a ``host:port`` address, fail within ``timeout_s`` when nothing accepts connections there.

    ``ray.init`` itself retries an unreachable address for minutes; this probe turns that into one clear error.
    (An open port that is not a Ray head is not detected here.)
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():  # "local", "auto": nothing to probe
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ValueError(f"trainer.ray.address={address!r}: nothing answers there ({error}); start the cluster "
                         "with `ray start --head`, or use trainer.ray.address=local for a private instance") from None


def ray_init_kwargs(config: RayConfig) -> dict[str, Any]:
    """The ``ray.init`` arguments for ``config`` (a function of its own so it can be checked without starting Ray)."""
    kwargs: dict[str, Any] = {
        "address": config.address,
        "logging_level": config.logging_level.upper(),
        "log_to_driver": True,
    }
    if config.address == "local":
        kwargs.update(
            num_cpus=config.num_cpus, num_gpus=config.num_gpus,
            object_store_memory=config.object_store_memory_mb * 2**20,
            include_dashboard=config.include_dashboard,
            _system_config=dict(LOCAL_SYSTEM_CONFIG),  # a copy: ray.init adds its own keys to the dict it is given
        )
    return kwargs


LOCAL_SYSTEM_CONFIG = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""A local instance starts no idle Python workers ahead of time: Ray would otherwise start one per CPU for tasks, and
hybridrl's worker groups are actors with an environment of their own, which never take them. Measured on the
2-core box (the vs_trl tiny run): −80 MiB of resident memory per idle worker, start-up unchanged."""

"""Run monitoring settings (``trainer.monitoring``): the Prometheus endpoint and the cost estimate.

The endpoint is off unless ``prometheus`` is listed in ``trainer.logger``; it binds to the loopback interface unless
told otherwise, since it exposes the run's metrics to anyone who can reach the port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridrl.config.errors import ConfigError
from hybridrl.config.frozen import FreezableConfig


@dataclass
class MonitoringConfig(FreezableConfig):
    prometheus_host: str = "127.0.0.1"
    """Address the Prometheus endpoint binds to (with ``prometheus`` in ``trainer.logger``); ``0.0.0.0`` exposes it
    on every interface — only behind a firewall."""
    prometheus_port: int = 9464
    """Port of the Prometheus endpoint (``/metrics``); 0 picks a free port (logged at start)."""
    price_per_gpu_hour: Optional[float] = None
    """Price of one device-hour (any currency): the progress display and the metrics then show the cost so far
    and the projected cost of the run (price × devices × hours, from the measured step time)."""

    def problems(self, prefix: str = "trainer.monitoring") -> ConfigError:
        """Every invalid field, each named with ``prefix``."""
        error = ConfigError()
        if not 0 <= self.prometheus_port <= 65535:
            error.add(f"{prefix}.prometheus_port", self.prometheus_port, "must be in [0, 65535]")
        if self.price_per_gpu_hour is not None and self.price_per_gpu_hour < 0:
            error.add(f"{prefix}.price_per_gpu_hour", self.price_per_gpu_hour, "must be >= 0")
        if not self.prometheus_host:
            error.add(f"{prefix}.prometheus_host", self.prometheus_host, "must be an address, e.g. 127.0.0.1")
        return error

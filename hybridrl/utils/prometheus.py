"""A Prometheus endpoint as a tracking backend (``prometheus`` in ``trainer.logger``; host and port in
``trainer.monitoring``): every step's metrics become gauges that a Prometheus server scrapes from ``/metrics``.

Metric names are the tracker's keys made Prometheus-safe with a ``hybridrl_`` prefix (:func:`prometheus_name`):
``actor/grad_norm`` → ``hybridrl_actor_grad_norm``, ``timing/update_actor`` → ``hybridrl_timing_update_actor``.
Each gauge carries ``project`` and ``experiment`` labels, so one Prometheus can watch several runs;
``hybridrl_step`` is the last logged step. ``monitoring/grafana_dashboard.json`` plots them.
"""

from __future__ import annotations

import logging
import math
import re

logger = logging.getLogger(__name__)

PREFIX = "hybridrl_"
LABELS = ("project", "experiment")


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """``{metric name: value}`` of every ``hybridrl_*`` sample an endpoint serves (e.g. ``http://127.0.0.1:9464/metrics``;
    for a quick look at a running job, or a test). Raises ``OSError`` when nothing answers."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith(PREFIX)}


def prometheus_name(key: str) -> str:
    """``actor/grad_norm`` → ``hybridrl_actor_grad_norm`` (``@`` becomes ``_at_``; other characters outside
    ``[a-zA-Z0-9_]`` become ``_``)."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key.replace("@", "_at_"))


class PrometheusBackend:
    """Serves the latest value of every metric over HTTP from a thread of this process (the controller).

    Args:
        host: address to bind (``127.0.0.1`` by default in the config: loopback only).
        port: port to bind; 0 picks a free one (``self.port`` tells which).
        project, experiment: label values of every gauge.
    """

    def __init__(self, host: str, port: int, project: str, experiment: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self._gauge_type = Gauge
        self.registry = CollectorRegistry()
        self._labels = {"project": project, "experiment": experiment}
        self._gauges: dict[str, object] = {}
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise ValueError(f"trainer.monitoring: cannot serve Prometheus metrics on {host}:{port}: {error}") from None
        self.host, self.port = host, self._server.server_port
        logger.info("Prometheus metrics at http://%s:%d/metrics", host, self.port)

    def _gauge(self, key: str):
        name = prometheus_name(key)
        if name not in self._gauges:
            self._gauges[name] = self._gauge_type(name, f"hybridrl metric {key}", LABELS, registry=self.registry)
        return self._gauges[name]

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in {**metrics, "step": float(step)}.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._gauge(key).labels(**self._labels).set(value)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

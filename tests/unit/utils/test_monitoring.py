"""Monitoring: the Prometheus endpoint scraped over loopback HTTP while a tiny model trains, metric names by hand,
the run clock's ETA and cost by hand, and the Grafana dashboard's shape. (The dashboard's metric names are checked
against a whole training run's export in ``tests/e2e/test_rl_trainer.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hybridrl.config import ConfigError, load_config
from hybridrl.config.monitoring import MonitoringConfig
from hybridrl.config.schema import OptimConfig
from hybridrl.utils.memory import memory_metrics
from hybridrl.utils.prometheus import prometheus_name, scrape
from hybridrl.utils.timing import RunClock, format_duration
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.utils.tracking import Tracker
from hybridrl.engines.optim import build_optimizer, build_scheduler, clipped_step

DASHBOARD = Path(__file__).resolve().parents[3] / "monitoring" / "grafana_dashboard.json"


def scrape_port(port: int) -> dict[str, float]:
    return scrape(f"http://127.0.0.1:{port}/metrics")


def test_metric_names_by_hand():
    assert prometheus_name("actor/grad_norm") == "hybridrl_actor_grad_norm"
    assert prometheus_name("val/gsm8k/acc@1") == "hybridrl_val_gsm8k_acc_at_1"
    assert prometheus_name("perf/throughput-tokens.s") == "hybridrl_perf_throughput_tokens_s"


def test_endpoint_serves_each_step_of_a_tiny_training_run_on_loopback(tmp_path):
    model = build_tiny_model(TinyModelSpec(), 64, pad_token_id=0, eos_token_id=1)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    scheduler = build_scheduler(optimizer, OptimConfig(lr=1e-2), total_steps=3)
    tracker = Tracker(["prometheus"], tmp_path, total_steps=3, experiment="tiny",
                      monitoring=MonitoringConfig(prometheus_port=0, price_per_gpu_hour=3.0), num_devices=2)
    backend = tracker.backends[0]
    try:
        assert backend.host == "127.0.0.1" and backend._server.server_address[0] == "127.0.0.1"
        inputs = torch.randint(0, 64, (2, 12))
        for step in range(1, 4):
            loss = model(inputs, labels=inputs).loss
            loss.backward()
            result = clipped_step(model, optimizer, scheduler, max_norm=1.0)
            memory = {f"actor/{key}": value for key, value in memory_metrics(torch.device("cpu")).items()}
            metrics = {"actor/pg_loss": float(loss.detach()), "actor/grad_norm": result.grad_norm, **memory}
            tracker.log(metrics, step)
            scraped = scrape_port(backend.port)
            assert scraped["hybridrl_step"] == step
            assert scraped["hybridrl_actor_grad_norm"] == pytest.approx(result.grad_norm)
            assert scraped["hybridrl_actor_pg_loss"] == pytest.approx(float(loss.detach()))
            assert scraped["hybridrl_actor_memory_host_rss_gib"] > 0
            assert scraped["hybridrl_cost_projected"] >= scraped["hybridrl_cost_so_far"] > 0
    finally:
        tracker.close()
    with pytest.raises(OSError):
        scrape_port(backend.port)  # closed with the tracker


def test_run_clock_excludes_the_first_step_and_prices_the_run():
    now = [100.0]
    clock = RunClock(10, num_devices=4, price_per_gpu_hour=2.0, clock=lambda: now[0])
    assert clock.mark(0) == {}  # validation before the first step: nothing measured yet
    now[0] = 160.0  # step 1: 60 s (start-up included)
    first = clock.mark(1)
    assert first["time/seconds_per_step"] == 60 and first["time/eta_s"] == 9 * 60
    now[0] = 170.0
    clock.mark(2)
    now[0] = 180.0
    third = clock.mark(3)
    assert third["time/seconds_per_step"] == 10  # steps 2 and 3 only
    assert third["time/eta_s"] == 70 and third["time/elapsed_s"] == 80
    assert third["cost/so_far"] == pytest.approx(2.0 * 4 * 80 / 3600)
    assert third["cost/projected"] == pytest.approx(2.0 * 4 * 150 / 3600)
    assert clock.mark(3) == {}  # a repeated step is not a new measurement
    resumed = RunClock(10, start_step=6, clock=lambda: now[0])
    now[0] = 200.0
    assert resumed.mark(7)["time/eta_s"] == 3 * 20 and "cost/so_far" not in resumed.mark(8)
    assert (format_duration(42), format_duration(185), format_duration(3720)) == ("42s", "3m05s", "1h02m")


def test_monitoring_config_is_validated():
    with pytest.raises(ConfigError) as raised:
        load_config(["trainer.monitoring.prometheus_port=70000", "trainer.monitoring.price_per_gpu_hour=-1",
                     "trainer.logger=[prometheus]"], check_paths=False)
    assert raised.value.keys == ["trainer.monitoring.prometheus_port", "trainer.monitoring.price_per_gpu_hour"]
    assert MonitoringConfig().prometheus_host == "127.0.0.1"


def test_dashboard_panels_query_hybridrl_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"datasource", "experiment"} <= variables
    targets = [target for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(targets) >= 20
    for target in targets:
        name, selector = target["expr"].split("{", 1)
        assert name.startswith("hybridrl_") and prometheus_name(name[len("hybridrl_"):]) == name
        assert selector == 'experiment=~"$experiment"}'

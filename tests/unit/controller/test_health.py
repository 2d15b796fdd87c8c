"""Training-health alarms on constructed metric sequences, checked against a plain loop written here."""

from __future__ import annotations

import logging
import math
import random

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.config.health import HealthConfig
from hybridrl.trainers.health import ENTROPY_METRIC, REWARD_METRIC, HealthMonitor, TrainingHealthError


def run(config: HealthConfig, rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    monitor = HealthMonitor(config)
    for step, row in enumerate(rows, start=1):
        monitor.observe(step, row)
    return [(alarm.step, alarm.kind) for alarm in monitor.fired]


def reference_alarms(config: HealthConfig, rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    """The slow obvious version: for every step, recompute every window from the full history."""
    history: dict[str, list[float]] = {}
    best, active, fired = -math.inf, set(), []
    for step, row in enumerate(rows, start=1):
        state = {}
        for name in (config.kl_metric, REWARD_METRIC, ENTROPY_METRIC):
            if name in row and math.isfinite(row[name]):
                history.setdefault(name, []).append(row[name])
                if len(history[name]) >= config.window:
                    state[name] = sum(history[name][-config.window:]) / config.window
        checks = {}
        if config.kl_metric in state:
            if config.kl_max is not None:
                checks["kl_high"] = state[config.kl_metric] > config.kl_max
            if config.kl_min is not None:
                checks["kl_low"] = state[config.kl_metric] < config.kl_min
        if REWARD_METRIC in state and config.reward_collapse_drop is not None:
            best = max(best, state[REWARD_METRIC])
            checks["reward_collapse"] = best - state[REWARD_METRIC] > config.reward_collapse_drop
        if ENTROPY_METRIC in state and config.entropy_min is not None:
            checks["entropy_collapse"] = state[ENTROPY_METRIC] < config.entropy_min
        for kind, bad in checks.items():
            if bad and kind not in active:
                fired.append((step, kind))
            (active.add if bad else active.discard)(kind)
    return fired


def test_kl_band_fires_on_leaving_and_rearms_on_return():
    config = HealthConfig(window=1, kl_min=0.001, kl_max=0.1)
    kl = [0.01, 0.05, 0.2, 0.3, 0.05, 0.0001, 0.0001, 0.02, 0.5]
    assert run(config, [{"actor/kl_loss": value} for value in kl]) == [(3, "kl_high"), (6, "kl_low"), (9, "kl_high")]


def test_windowed_kl_ignores_a_single_spike():
    config = HealthConfig(window=3, kl_max=0.1)
    kl = [0.02, 0.02, 0.25, 0.02, 0.02, 0.2, 0.2, 0.2]
    # means of 3: .., 0.097, 0.097, 0.097, 0.08, 0.14 (step 7) -> one alarm
    assert run(config, [{"actor/kl_loss": value} for value in kl]) == [(7, "kl_high")]


def test_reward_collapse_is_a_drop_below_the_best_window():
    config = HealthConfig(window=2, reward_collapse_drop=0.3, entropy_min=None)
    rewards = [0.1, 0.3, 0.6, 0.8, 0.7, 0.4, 0.2, 0.1, 0.1]
    # windowed: -, .2, .45, .7, .75, .55, .3 (drop .45 > .3 at step 7), .15, .1
    assert run(config, [{REWARD_METRIC: value} for value in rewards]) == [(7, "reward_collapse")]


def test_a_reward_that_never_rose_does_not_collapse():
    config = HealthConfig(window=2, reward_collapse_drop=0.2)
    assert run(config, [{REWARD_METRIC: 0.0}] * 20) == []


def test_entropy_collapse_default_floor_and_missing_steps_are_skipped():
    config = HealthConfig(window=2)  # entropy_min defaults to 0.01 nats/token
    rows = [{ENTROPY_METRIC: 0.5}, {}, {ENTROPY_METRIC: 0.004}, {ENTROPY_METRIC: math.nan}, {ENTROPY_METRIC: 0.003}]
    # windows of finite values: [.5], [.5,.004]=.252, [.004,.003]=.0035 at step 5
    assert run(config, rows) == [(5, "entropy_collapse")]


@pytest.mark.parametrize("seed", range(5))
def test_matches_the_reference_on_random_sequences(seed):
    generator = random.Random(seed)
    config = HealthConfig(window=generator.randint(1, 4), kl_min=0.01, kl_max=0.08, reward_collapse_drop=0.2,
                          entropy_min=0.1)
    rows, kl_level = [], 0.05
    for step in range(60):
        row = {}
        if step % 10 == 0:  # regimes of 10 steps: KL low, normal or high
            kl_level = generator.choice([0.003, 0.05, 0.11])
        if generator.random() > 0.1:
            row["actor/kl_loss"] = kl_level * generator.uniform(0.5, 1.5)
        if generator.random() > 0.1:
            row[REWARD_METRIC] = generator.uniform(0, 1)
        if generator.random() > 0.1:
            row[ENTROPY_METRIC] = generator.choice([generator.uniform(0, 0.2), math.nan])
        rows.append(row)
    expected = reference_alarms(config, rows)
    assert {kind for _, kind in expected} == {"kl_high", "kl_low", "reward_collapse", "entropy_collapse"}
    assert run(config, rows) == expected


def test_warning_names_the_step_and_the_key(caplog):
    monitor = HealthMonitor(HealthConfig(window=1, kl_max=0.1))
    with caplog.at_level(logging.WARNING):
        assert monitor.observe(12, {"actor/kl_loss": 0.4}) == {"health/alarms": 1.0}
    assert "training health: step 12: actor/kl_loss = 0.4" in caplog.text
    assert "trainer.health.kl_max=0.1" in caplog.text


def test_stop_on_alarm_raises_after_the_step_and_only_then():
    monitor = HealthMonitor(HealthConfig(window=1, entropy_min=0.05, stop_on_alarm=True))
    monitor.observe(1, {ENTROPY_METRIC: 0.5})
    monitor.raise_if_stopping()
    monitor.observe(2, {ENTROPY_METRIC: 0.01})
    with pytest.raises(TrainingHealthError, match="step 2: entropy collapse"):
        monitor.raise_if_stopping()
    monitor.raise_if_stopping()  # reported once


def test_disabled_monitor_is_silent():
    monitor = HealthMonitor(HealthConfig(enable=False, window=1, kl_max=0.0001, stop_on_alarm=True))
    assert monitor.observe(1, {"actor/kl_loss": 5.0}) == {}
    monitor.raise_if_stopping()


@pytest.mark.parametrize(("override", "phrase"), [
    ("trainer.health.window=0", "trainer.health.window=0: must be >= 1"),
    ("trainer.health.kl_min=0.5", "trainer.health.kl_min=0.5: must be below trainer.health.kl_max=0.1"),
    ("trainer.health.entropy_min=-1", "trainer.health.entropy_min=-1"),
])
def test_bad_health_config_names_the_key(override, phrase):
    extra = ["trainer.health.kl_max=0.1"] if "kl_min" in override else []
    with pytest.raises(ConfigError) as caught:
        load_config([override, *extra], check_paths=False)
    assert phrase in str(caught.value)

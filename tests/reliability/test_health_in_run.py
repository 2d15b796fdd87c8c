"""The health monitor inside a real run: an alarm is logged with its step, counted in metrics.jsonl and, with
``trainer.health.stop_on_alarm``, stops the run after that step was logged."""

from __future__ import annotations

import pytest
from bad_input_cases import run_overrides

from hybridrl.config import load_config
from hybridrl.trainers.health import TrainingHealthError
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long]


def test_entropy_alarm_stops_the_run_after_the_step(tmp_path, caplog):
    model_dir = save_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "run"
    # A floor above any possible entropy of this vocabulary: the alarm must fire on the first step.
    config = load_config(run_overrides(model_dir, run_dir, "trainer.total_training_steps=3",
                                       "trainer.health.window=1", "trainer.health.entropy_min=100",
                                       "trainer.health.stop_on_alarm=true"))
    with pytest.raises(TrainingHealthError, match="step 1: entropy collapse: actor/entropy = "):
        RLTrainer(config).fit()
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1] and rows[0]["health/alarms"] == 1.0
    assert "training health: step 1: entropy collapse" in caplog.text

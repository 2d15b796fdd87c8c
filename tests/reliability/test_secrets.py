"""Secrets (wandb / mlflow / hub tokens) never land in the dumped config, the metrics, the driver's output or logs,
or Ray's session logs — for a real run that carries them in its environment, in ``trainer.ray.worker_env`` and in an
extra config key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import ray
from bad_input_cases import run_overrides

from env_worker import EnvWorker

from hybridrl.config import ConfigError, load_config
from hybridrl.config.ray import RayConfig
from hybridrl.runtime import PoolSpec, ResourcePool, WorkerGroup, start_ray
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model


SECRETS = {"env": "sk-env-6f1d2a9c", "worker_env": "sk-worker-0b7e44c1", "extra": "sk-extra-93aa01fe"}


class RecordingTrainer(RLTrainer):
    """Notes Ray's session directory (its logs stay on disk after the run)."""

    session_dir: Path

    def _start_workers(self, runtime) -> None:
        RecordingTrainer.session_dir = Path(ray._private.worker._global_node.get_session_dir_path())
        super()._start_workers(runtime)


@pytest.fixture(autouse=True)
def _shared_ray():
    """This module needs a Ray of its own, started with each test's settings (debug-level logs, whose files are
    scanned for secrets): the process's shared instance (``tests/shared_ray.py``) is stopped first."""
    if ray.is_initialized():
        ray.shutdown()


def files_holding(root: Path, secret: str) -> list[str]:
    return [str(path) for path in root.rglob("*") if path.is_file() and not path.is_symlink()
            and not path.is_socket() and secret.encode() in path.read_bytes()]


@pytest.mark.long  # a whole run, then every log and output file searched: 74 s inside the parallel suite
@pytest.mark.e2e
@pytest.mark.distributed
def test_secrets_stay_out_of_config_metrics_output_and_logs(tmp_path, monkeypatch, caplog, capfd):
    monkeypatch.setenv("WANDB_API_KEY", SECRETS["env"])
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRETS["env"])
    run_dir = tmp_path / "run"
    config = load_config(run_overrides(
        save_tiny_model(tmp_path / "model"), run_dir,
        f"trainer.ray.worker_env={{WANDB_API_KEY: {SECRETS['worker_env']}, HF_TOKEN: {SECRETS['worker_env']}}}",
        f"+extra.mlflow_tracking_token={SECRETS['extra']}", "trainer.logger=[jsonl,console,tensorboard]",
        "trainer.ray.logging_level=debug"))
    with caplog.at_level(logging.DEBUG):
        RecordingTrainer(config).fit()
    dumped = (run_dir / "config.yaml").read_text()
    assert "WANDB_API_KEY: '***'" in dumped and "mlflow_tracking_token: '***'" in dumped  # redacted, not dropped
    output = capfd.readouterr()
    for secret in SECRETS.values():
        assert secret not in caplog.text and secret not in output.out and secret not in output.err
        assert files_holding(run_dir, secret) == []
        assert files_holding(RecordingTrainer.session_dir / "logs", secret) == []


@pytest.mark.distributed
def test_a_secret_in_worker_env_reaches_the_worker_but_not_rays_logs(tmp_path):
    secret = SECRETS["worker_env"]
    config = RayConfig(num_cpus=2, worker_env={"PYTHONPATH": str(Path(__file__).parent), "MY_SERVICE_TOKEN": secret,
                                                "PLAIN_FLAG": "on"})
    with start_ray(config) as runtime:
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        pool = ResourcePool.create(PoolSpec("secrets", devices_per_node=1, device="cpu"), runtime)
        group = WorkerGroup(EnvWorker, pool, name="env")
        try:
            assert group.call(EnvWorker.getenv, "MY_SERVICE_TOKEN") == [secret]
            assert group.call(EnvWorker.getenv, "PLAIN_FLAG") == ["on"]
        finally:
            group.shutdown()
            pool.release()
        agent_log = (session / "logs" / "runtime_env_agent.log").read_text()
    assert "PLAIN_FLAG" in agent_log  # the agent does log env_vars: the secret went another way
    assert files_holding(session / "logs", secret) == []


def test_config_errors_redact_credentials():
    error = ConfigError([("extra.wandb_api_key", SECRETS["extra"], "is not used"), ("rollout.n", 0, "must be > 0")])
    assert SECRETS["extra"] not in str(error) and "extra.wandb_api_key='***'" in str(error)
    assert "rollout.n=0" in str(error)

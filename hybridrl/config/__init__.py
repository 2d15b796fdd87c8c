"""Configuration: dataclass schema (the truth), Hydra composition of ``conf/``, validation, derived batch sizes."""

from hybridrl.config.errors import ConfigError
from hybridrl.config.frozen import FrozenConfigError
from hybridrl.config.loader import compose_yaml, config_dir, config_to_yaml, dump_config, load_config, to_schema
from hybridrl.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
    TrainerConfig,
)
from hybridrl.config.sizes import BatchPlan, plan_batches, role_plan, world_size
from hybridrl.config.validation import critic_enabled, resolved_device, validate_config

__all__ = [
    "ActorConfig", "AlgorithmConfig", "BatchPlan", "ConfigError", "CriticConfig", "DataConfig", "FrozenConfigError",
    "ModelConfig", "RolloutConfig", "TrainConfig", "TrainerConfig", "compose_yaml", "config_dir", "config_to_yaml",
    "critic_enabled", "dump_config", "load_config", "plan_batches", "resolved_device", "role_plan", "to_schema", "validate_config",
    "world_size",
]

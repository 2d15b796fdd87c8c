"""Which keys hold credentials (tracking-service tokens, API keys, passwords), so their values stay out of logs.

Used for config keys (``dump_config``, ``ConfigError`` messages) and environment variables (``trainer.ray.worker_env``:
secrets reach the workers as an actor argument, never through Ray's ``runtime_env``, whose agent logs it verbatim).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

SECRET_KEY_PATTERN = re.compile(r"(^|_)(token|api_key|apikey|password|secret)$", re.IGNORECASE)
REDACTED = "***"


def is_secret_key(key: Any) -> bool:
    """``WANDB_API_KEY``, ``mlflow_tracking_token``, ``trainer.x.password`` (last dotted part) → True."""
    return bool(SECRET_KEY_PATTERN.search(str(key).rsplit(".", 1)[-1]))


def split_secrets(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(public, secret)`` halves of an environment mapping."""
    public = {key: value for key, value in env.items() if not is_secret_key(key)}
    return public, {key: value for key, value in env.items() if is_secret_key(key)}

"""Checks of ``algorithm.distillation``: its weights, and — against this machine's files — a teacher directory whose
vocabulary is the policy's (the teacher scores the student's token ids: another vocabulary would score other text).
"""

from __future__ import annotations

from typing import Optional

from hybridrl.config.checks import _require
from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig
from hybridrl.config.validation_machine import _check_model_dir, model_positions

KEY = "algorithm.distillation"


def check_distillation(config: TrainConfig, error: ConfigError) -> None:
    """What does not depend on files: the weights, when a teacher is set."""
    distillation = config.algorithm.distillation
    if not distillation.teacher_path:
        for key, value in (("kl_coef", distillation.kl_coef), ("task_weight", distillation.task_weight)):
            if value != 1.0:
                error.add(f"{KEY}.{key}", value, f"is read only with {KEY}.teacher_path (on-policy distillation); "
                                                 "set the teacher, or drop this key")
        return
    _require(error, f"{KEY}.kl_coef", distillation.kl_coef, distillation.kl_coef >= 0, "must be >= 0")
    _require(error, f"{KEY}.task_weight", distillation.task_weight, distillation.task_weight >= 0, "must be >= 0")
    if distillation.kl_coef == 0 and distillation.task_weight == 0:
        error.add(f"{KEY}.kl_coef", 0.0, f"and {KEY}.task_weight are both 0: nothing would be learned")


def check_teacher_files(config: TrainConfig, error: ConfigError) -> None:
    """The teacher is a model directory, and its tokenizer maps every token as the policy's does."""
    teacher = config.algorithm.distillation.teacher_path
    if not teacher:
        return
    found = ConfigError()
    _check_model_dir(found, f"{KEY}.teacher_path", teacher)
    if found:
        error.extend(found)
        return
    policy = config.model.tokenizer_path or config.model.path
    problem = _vocabulary_difference(policy, teacher)
    if problem:
        error.add(f"{KEY}.teacher_path", teacher, f"the teacher's vocabulary is not the policy's ({policy}): "
                  f"{problem}; the teacher scores the student's token ids, so it needs the same tokenizer")
    _check_teacher_positions(config, teacher, error)


def _check_teacher_positions(config: TrainConfig, teacher: str, error: ConfigError) -> None:
    """The teacher scores whole prompt + response sequences, so it needs their positions (as the policy does)."""
    import json
    from pathlib import Path

    positions = model_positions(json.loads((Path(teacher) / "config.json").read_text(encoding="utf-8")))
    longest = config.data.max_prompt_length + config.data.max_response_length
    if positions is not None and longest > positions:
        error.add(f"{KEY}.teacher_path", teacher, f"the teacher has {positions} positions (max_position_embeddings), "
                  f"fewer than data.max_prompt_length + data.max_response_length = {longest} tokens it must score; "
                  "shorten the data lengths or choose a teacher with a longer context")


def _vocabulary_difference(policy: str, teacher: str) -> Optional[str]:
    """How the two tokenizers' vocabularies differ (``None``: they are the same)."""
    from transformers import AutoTokenizer  # only with a teacher, and only when the files are checked

    try:
        theirs, ours = AutoTokenizer.from_pretrained(teacher), AutoTokenizer.from_pretrained(policy)
    except (OSError, ValueError) as failure:
        return f"a tokenizer does not load ({str(failure).splitlines()[0]})"
    teacher_vocabulary, policy_vocabulary = theirs.get_vocab(), ours.get_vocab()
    if teacher_vocabulary == policy_vocabulary:
        return None
    different = sorted(set(teacher_vocabulary.items()) ^ set(policy_vocabulary.items()))[:3]
    return (f"{len(teacher_vocabulary)} against {len(policy_vocabulary)} tokens, e.g. "
            + ", ".join(f"{token!r} → {index}" for token, index in different))

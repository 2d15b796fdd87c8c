"""Reward for the synthetic ``shapes`` image task (:mod:`hybridrl.data.shapes`): the whole response, stripped and
lower-cased, must be the answer (``"red"``, ``"2"``): 1.0, else 0.0."""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict | None = None) -> dict[str, float]:
    """``{"score": 0.0|1.0, "acc": 0.0|1.0}``: exact match of the stripped, lower-cased response."""
    correct = float(solution_str.strip().lower() == str(ground_truth).strip().lower())
    return {"score": correct, "acc": correct}

"""Checks of ``reward_judge`` (an LLM judge's score as a reward): where the judge is, its template and how its
reply is read; against this machine's files, the directory of a judge hybridrl serves itself.

The judge reads text, so its tokenizer may differ from the policy's: no vocabulary check.
"""

from __future__ import annotations

import os
import re

from hybridrl.config.checks import _choice, _positive, _require
from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig
from hybridrl.config.validation_machine import _check_model_dir

KEY = "reward_judge"
SERVE_DTYPES = ("bfloat16", "float32", "float16")


def check_judge(config: TrainConfig, error: ConfigError) -> None:
    """What does not depend on files (only when the judge is on; its keys are inert otherwise)."""
    judge = config.reward_judge
    if not judge.enable:
        return
    if bool(judge.base_url) == bool(judge.model_path):
        error.add(f"{KEY}.base_url", judge.base_url, f"give exactly one of {KEY}.base_url (a judge already served) "
                                                      f"and {KEY}.model_path (hybridrl serves it), not "
                                                      f"{'both' if judge.base_url else 'neither'}")
    elif judge.base_url and not re.match(r"https?://", judge.base_url):
        error.add(f"{KEY}.base_url", judge.base_url, "must be an http(s) URL, e.g. http://127.0.0.1:8000/v1")
    _require(error, f"{KEY}.template", judge.template, "{response}" in judge.template,
             "has no {response} placeholder: the judge would never see the response")
    _choice(error, f"{KEY}.api", judge.api, ("chat", "completions"))
    _require(error, f"{KEY}.system_prompt", judge.system_prompt, not (judge.system_prompt and judge.api != "chat"),
             "is sent only with api=chat")
    _check_parser(config, error)
    _positive(error, [(f"{KEY}.max_tokens", judge.max_tokens), (f"{KEY}.timeout_s", judge.timeout_s),
                      (f"{KEY}.max_concurrency", judge.max_concurrency),
                      (f"{KEY}.serve_max_model_len", judge.serve_max_model_len),
                      (f"{KEY}.serve_start_timeout_s", judge.serve_start_timeout_s)], allow_none=False)
    _require(error, f"{KEY}.max_retries", judge.max_retries, judge.max_retries >= 0, "must be >= 0")
    _require(error, f"{KEY}.temperature", judge.temperature, judge.temperature >= 0, "must be >= 0")
    _choice(error, f"{KEY}.serve_dtype", judge.serve_dtype, SERVE_DTYPES)


def _check_parser(config: TrainConfig, error: ConfigError) -> None:
    judge = config.reward_judge
    if judge.score_fn is not None:
        path, separator, name = judge.score_fn.rpartition(":")
        _require(error, f"{KEY}.score_fn", judge.score_fn, bool(separator and path.endswith(".py") and name),
                 "must be 'path/to/file.py:function_name'")
    else:
        try:
            pattern = re.compile(judge.score_regex)
        except re.error as failure:
            error.add(f"{KEY}.score_regex", judge.score_regex, f"is not a regular expression ({failure})")
        else:
            _require(error, f"{KEY}.score_regex", judge.score_regex, pattern.groups <= 1,
                     f"has {pattern.groups} groups: give one (the score) or none (the whole match)")
    score_range = judge.score_range
    if score_range is not None:
        _require(error, f"{KEY}.score_range", score_range,
                 len(score_range) == 2 and float(score_range[0]) <= float(score_range[1]), "must be [low, high]")


def check_judge_files(config: TrainConfig, error: ConfigError) -> None:
    """A judge hybridrl serves is a model directory; a score function's file exists."""
    judge = config.reward_judge
    if not judge.enable:
        return
    if judge.model_path:
        _check_model_dir(error, f"{KEY}.model_path", judge.model_path)
    if judge.api_key_env and not os.environ.get(judge.api_key_env):
        error.add(f"{KEY}.api_key_env", judge.api_key_env, "names an environment variable that is not set here")
    if judge.score_fn:
        from pathlib import Path

        path = judge.score_fn.rpartition(":")[0]
        _require(error, f"{KEY}.score_fn", judge.score_fn, Path(path).is_file(), f"{path} does not exist")

"""Configuration of reward scoring: the rule function (``custom_reward_function``), the reward-model group
(``reward_model``), an LLM judge (``reward_judge``) and how their scores are fused (``reward_fusion``). Part of
:mod:`hybridrl.config.schema`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hybridrl.config.frozen import FreezableConfig


@dataclass
class RewardModelConfig(FreezableConfig):
    enable: bool = False
    """Score responses with a reward-model worker group (in addition to, or instead of, rule rewards)."""
    model_path: Optional[str] = None
    """Reward-model directory (``AutoModelForSequenceClassification``)."""
    micro_batch_size_per_gpu: int = 4
    """Sequences per reward-model forward on one device."""
    n_gpus: int = 0
    """Where the reward-model group runs: ``0`` colocated on the actor's devices (its own process on each, sharing
    the device); ``N > 0`` its own pool of ``N`` devices on one node (``trainer.device``'s type), so a large reward
    model need not share memory with the policy."""


@dataclass
class RewardFusionConfig(FreezableConfig):
    enable: bool = False
    """Fuse reward components (rule score, reward model, guards) into one score; on whenever the reward model is."""
    rule_weight: float = 1.0
    """Weight of the rule-function score (``reward/rule/*``)."""
    rm_weight: float = 1.0
    """Weight of the reward model's score (``reward/rm/*``)."""
    judge_weight: float = 1.0
    """Weight of the LLM judge's score (``reward/judge/*``; ``reward_judge``)."""
    normalize: list[str] = field(default_factory=list)
    """Components normalised by a running mean/std before weighting, e.g. ``[rm]`` (``rule``, ``rm``, ``judge``)."""
    weighting: str = "fixed"
    """``fixed``: the weights above. ``inverse_std`` (dynamic): the rule, RM and judge weights are divided by each one's
    running standard deviation over all batches so far, so each contributes by its weight whatever its spread; the
    effective weights are logged as ``reward/<name>/weight``. Guards keep their coefficients."""
    length_penalty_coef: float = 0.0
    """Length guard: adds ``−coef · response_length / data.max_response_length`` (0 disables)."""
    diversity_penalty_coef: float = 0.0
    """Diversity guard: adds ``−coef ×`` mean similarity to the other responses of the same prompt (0 disables)."""
    cap: Optional[float] = None
    """Upper bound on the fused reward (``null``: none)."""


DEFAULT_JUDGE_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong or useless) to 10 (correct and complete).\n\n"
    "Question:\n{prompt}\n\nResponse:\n{response}\n\nEnd your reply with a line 'Score: N'.")


@dataclass
class RewardJudgeConfig(FreezableConfig):
    enable: bool = False
    """Score responses with an LLM judge: a served model reads each (prompt, response) and replies with a score
    (``reward/judge/*``; fused with the other components by ``reward_fusion.judge_weight``)."""
    base_url: Optional[str] = None
    """An OpenAI-compatible endpoint already serving the judge, e.g. ``http://127.0.0.1:8000/v1`` (``hybridrl serve``,
    ``vllm serve``, a hosted API). Exactly one of ``base_url`` and ``model_path``."""
    model_path: Optional[str] = None
    """A model directory hybridrl serves itself for the run (``hybridrl serve`` in a process of its own, on the
    controller's machine, stopped with the run). It sees the controller's devices: on a GPU machine whose devices
    the trainer uses, serve the judge elsewhere and give ``base_url``. Exactly one of ``base_url`` and
    ``model_path``."""
    model: Optional[str] = None
    """The model name sent with each request (``null``: the first one the endpoint's ``/models`` lists)."""
    api: str = "chat"
    """``chat``: the rendered template is one user message to ``/chat/completions`` (after ``system_prompt``).
    ``completions``: it is the raw prompt of ``/completions`` (no chat template)."""
    template: str = DEFAULT_JUDGE_TEMPLATE
    """The judge's prompt. ``{response}`` (required) is the policy's response; ``{prompt}`` the prompt's message
    texts; ``{ground_truth}`` the row's reference answer (a reference-guided judge). Nothing else is substituted:
    other braces stay as they are."""
    system_prompt: Optional[str] = None
    """A system message before the template (``api=chat`` only)."""
    score_regex: str = r"Score:\s*(-?\d+(?:\.\d+)?)"
    """Where the score is in the judge's reply: the first match's group 1 (or the whole match, without a group),
    read as a number. A reply without a match is a parse failure (``reward/judge/num_parse_failure``)."""
    score_fn: Optional[str] = None
    """Instead of ``score_regex``: ``path/to/file.py:name``, a function ``(reply: str) -> float | None`` (``None``
    or an exception: a parse failure)."""
    score_range: Optional[list[float]] = None
    """``[low, high]``: a parsed score outside is a parse failure (``null``: any number)."""
    fallback_score: float = 0.0
    """The score of a response whose judgement failed (no reply in time, an HTTP error, a reply that does not
    parse); every one is counted (``reward/judge/num_*``) and the first of each batch is logged."""
    max_tokens: int = 64
    """Most tokens the judge may reply with."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: greedy)."""
    timeout_s: float = 60.0
    """Per-request limit in seconds, on each phase of a request (connecting, sending, waiting for the reply); past
    it the request counts as a timeout and is not retried."""
    max_retries: int = 1
    """Retries of a request whose connection failed or whose status was 429/5xx (not of timeouts)."""
    max_concurrency: int = 32
    """Requests in flight at once."""
    api_key_env: Optional[str] = None
    """The environment variable holding the endpoint's API key (sent as a bearer token); the key itself never enters
    the config, so it is not saved with the run."""
    serve_dtype: str = "bfloat16"
    """With ``model_path``: the served judge's dtype (``bfloat16``, ``float32``, ``float16`` on GPU)."""
    serve_max_model_len: int = 2048
    """With ``model_path``: the served judge's context length (rendered template + reply)."""
    serve_start_timeout_s: float = 600.0
    """With ``model_path``: how long the served judge may take to load before the run stops."""


@dataclass
class CustomRewardConfig(FreezableConfig):
    path: Optional[str] = None
    """Python file defining your reward function; ``null`` uses the built-in registry routed by ``data_source``."""
    name: str = "compute_score"
    """Function name inside ``path``: ``(data_source, solution_str, ground_truth, extra_info) -> float``."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the reward function. A custom function gets them all; a built-in one those it declares
    (refused if none does): gsm8k ``correct_score`` (1.0), ``unformatted_correct_score`` (0.5: a right number
    without ``####``; 0 = verl's strict scoring), ``format_score`` (0.0: a wrong ``#### N``); math_dapo / aime*
    ``correct_score`` (1.0), ``incorrect_score`` (-1.0); searchR1_* ``correct_score``, ``format_score``; math
    ``timeout_s``. Example: ``+custom_reward_function.reward_kwargs.unformatted_correct_score=0``."""
    timeout_s: float = 10.0
    """Per-sample timeout; a reward function that hangs or raises scores 0 and is counted as a warning."""

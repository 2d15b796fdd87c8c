"""An LLM judge as a reward: each (prompt, response) is sent to a served model, and a score is read from its reply.

    reply_i = judge( render(template, prompt_i, response_i, ground_truth_i) )
    score_i = parse(reply_i)               if the request succeeded and the reply parses (in ``score_range``)
            = fallback_score               otherwise — and counted by why (timeout, error, parse_failure)

The judge is any OpenAI-compatible endpoint (``/chat/completions`` or ``/completions``): ``hybridrl serve``,
``vllm serve`` or a hosted API. Requests run concurrently on a thread pool (``max_concurrency``; threads, not an event
loop, so a notebook's running loop does not get in the way), each with its own timeout and retries of connection
failures and 429/5xx answers. A batch in which *every* judgement failed raises: a judge that is down or a regex that
never matches must stop the run, not train it on ``fallback_score``.

Pure HTTP client (``httpx``); the served judge of ``reward_judge.model_path`` is :mod:`hybridrl.rewards.judge_server`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

__all__ = ["JudgeQuery", "JudgeClient", "JudgeBatch", "JudgeError", "render_template", "regex_parser",
           "load_score_fn", "JUDGE_FAILURES"]

logger = logging.getLogger(__name__)

OK, TIMEOUT, ERROR, PARSE_FAILURE = "ok", "timeout", "error", "parse_failure"
JUDGE_FAILURES = (TIMEOUT, ERROR, PARSE_FAILURE)
PLACEHOLDERS = ("{prompt}", "{response}", "{ground_truth}")
_RETRIED_STATUSES = {429, 500, 502, 503, 504}
KEY = "reward_judge"


class JudgeError(ValueError):
    """The judge cannot score the run (every judgement of a batch failed, its server did not start): one line for
    the user, naming the endpoint and the first failure (a ``ValueError``: the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class JudgeQuery:
    """What the judge reads about one response: the prompt's text, the response's, and the reference answer."""

    prompt: str
    response: str
    ground_truth: Optional[str] = None


def render_template(template: str, query: JudgeQuery) -> str:
    """``template`` with ``{prompt}``, ``{response}`` and ``{ground_truth}`` replaced in one pass (a response that
    contains ``{prompt}`` stays as written; other braces are left alone)."""
    values = {"{prompt}": query.prompt, "{response}": query.response, "{ground_truth}": query.ground_truth or ""}
    return re.sub(r"\{(?:prompt|response|ground_truth)\}", lambda match: values[match.group(0)], template)


def regex_parser(pattern: str) -> Callable[[str], Optional[float]]:
    """A parser reading the first match's group 1 (the whole match without a group) as a number; ``None`` when
    nothing matches or the text is not a number."""
    compiled = re.compile(pattern)

    def parse(reply: str) -> Optional[float]:
        match = compiled.search(reply)
        if match is None:
            return None
        try:
            return float(match.group(1) if compiled.groups else match.group(0))
        except ValueError:
            return None
    return parse


def load_score_fn(spec: str) -> Callable[[str], Optional[float]]:
    """The function ``name`` of ``path/to/file.py:name`` (``ValueError`` naming ``reward_judge.score_fn``)."""
    from hybridrl.utils.user_files import import_user_file

    path, separator, name = spec.rpartition(":")
    if not separator or not path or not name:
        raise ValueError(f"{KEY}.score_fn={spec!r} must be 'path/to/file.py:function_name'")
    module = import_user_file(path, f"{KEY}.score_fn")
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{KEY}.score_fn={spec!r}: {path} defines no function {name!r}")
    return function


@dataclass
class JudgeBatch:
    """One batch's judgements: ``scores`` ``[B]`` (``fallback_score`` where one failed), per response its status
    (``ok`` or one of :data:`JUDGE_FAILURES`), the judge's reply text (``""`` without one) and why it failed."""

    scores: torch.Tensor
    statuses: list[str]
    replies: list[str]
    problems: list[str] = field(default_factory=list)

    def metrics(self, prefix: str = "reward/judge/") -> dict[str, float]:
        """``…/num_timeout``, ``…/num_error``, ``…/num_parse_failure`` (counts in this batch)."""
        return {f"{prefix}num_{status}": float(self.statuses.count(status)) for status in JUDGE_FAILURES}


@dataclass(frozen=True)
class _Judgement:
    status: str
    score: Optional[float] = None
    reply: str = ""
    problem: str = ""


class JudgeClient:
    """Scores batches of :class:`JudgeQuery` with a served judge (see the module docstring).

    Args:
        base_url: the endpoint's root, e.g. ``http://127.0.0.1:8000/v1``.
        template: the prompt, with ``{response}`` (and optionally ``{prompt}``, ``{ground_truth}``).
        parse: reply text → score, ``None`` for a reply that does not parse.
        model: the model name sent (``None``: the first of ``GET /models``).
        api: ``chat`` or ``completions``.
        fallback_score, score_range, max_tokens, temperature, timeout_s, max_retries, max_concurrency,
        system_prompt: as the ``reward_judge`` keys of the same names; ``api_key``: the bearer token, if any.
    """

    def __init__(self, base_url: str, template: str, parse: Callable[[str], Optional[float]], *,
                 model: Optional[str] = None, api: str = "chat", system_prompt: Optional[str] = None,
                 fallback_score: float = 0.0, score_range: Optional[Sequence[float]] = None, max_tokens: int = 64,
                 temperature: float = 0.0, timeout_s: float = 60.0, max_retries: int = 1, max_concurrency: int = 32,
                 api_key: Optional[str] = None) -> None:
        import httpx

        if "{response}" not in template:
            raise ValueError(f"{KEY}.template has no {{response}} placeholder: the judge would never see the response")
        if api not in ("chat", "completions"):
            raise ValueError(f"{KEY}.api={api!r}: choose chat or completions")
        self.base_url, self.template, self.parse, self.api = base_url.rstrip("/"), template, parse, api
        self.system_prompt, self.fallback_score = system_prompt, float(fallback_score)
        self.score_range = tuple(score_range) if score_range is not None else None
        self.max_tokens, self.temperature, self.max_retries = max_tokens, temperature, max_retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers,
                                 limits=httpx.Limits(max_connections=max_concurrency))
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="judge")
        self.closers: list[Callable[[], None]] = []  # run by close(), last: e.g. stopping a judge served for the run
        self.diagnose: Callable[[], str] = lambda: ""  # why the endpoint may be gone (a served judge's exit)
        try:
            self.model = model or self._served_model()
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, judge: Any, base_url: str) -> "JudgeClient":
        """A client for the ``reward_judge`` section ``judge`` talking to ``base_url``."""
        parse = load_score_fn(judge.score_fn) if judge.score_fn else regex_parser(judge.score_regex)
        api_key = os.environ.get(judge.api_key_env) if judge.api_key_env else None
        if judge.api_key_env and not api_key:
            raise ValueError(f"{KEY}.api_key_env={judge.api_key_env!r}: that environment variable is not set")
        return cls(base_url, judge.template, parse, model=judge.model, api=judge.api,
                   system_prompt=judge.system_prompt, fallback_score=judge.fallback_score,
                   score_range=judge.score_range, max_tokens=judge.max_tokens, temperature=judge.temperature,
                   timeout_s=judge.timeout_s, max_retries=judge.max_retries, max_concurrency=judge.max_concurrency,
                   api_key=api_key)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.close()
        while self.closers:
            self.closers.pop()()

    def __enter__(self) -> "JudgeClient":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # ------------------------------------------------------------------ scoring
    def score(self, queries: Sequence[JudgeQuery]) -> JudgeBatch:
        """Judge every query (concurrently); raises :class:`JudgeError` when all of a non-empty batch failed."""
        judgements = list(self.pool.map(self._judge, queries))
        scores = [self.fallback_score if item.score is None else item.score for item in judgements]
        batch = JudgeBatch(torch.tensor(scores, dtype=torch.float32), [item.status for item in judgements],
                           [item.reply for item in judgements],
                           [f"response {index}: {item.status}: {item.problem}" for index, item in
                            enumerate(judgements) if item.status != OK])
        if batch.problems and len(batch.problems) == len(queries):
            raise JudgeError(f"{KEY}: every one of the batch's {len(queries)} judgements failed, so the judge at "
                             f"{self.base_url} cannot score this run; first: {batch.problems[0]}{self.diagnose()}")
        if batch.problems:
            logger.warning("%s: %d of %d judgements failed and scored fallback_score=%g, e.g. %s", KEY,
                           len(batch.problems), len(queries), self.fallback_score, batch.problems[0])
        return batch

    def _judge(self, query: JudgeQuery) -> _Judgement:
        import httpx

        try:
            reply = self._reply(render_template(self.template, query))
        except httpx.TimeoutException:
            return _Judgement(TIMEOUT, problem=f"no reply within the timeout from {self.base_url}")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as failure:
            return _Judgement(ERROR, problem=str(failure).splitlines()[0] if str(failure) else type(failure).__name__)
        try:
            parsed = self.parse(reply)
            score = None if parsed is None else float(parsed)
        except Exception as failure:  # a user's score_fn: its failure is a parse failure, not the run's
            return _Judgement(PARSE_FAILURE, reply=reply, problem=f"the parser raised {failure!r} on {reply[:200]!r}")
        if score is None or not math.isfinite(score):
            return _Judgement(PARSE_FAILURE, reply=reply, problem=f"no score in the reply {reply[:200]!r}")
        low, high = self.score_range or (-math.inf, math.inf)
        if not low <= score <= high:
            return _Judgement(PARSE_FAILURE, reply=reply,
                              problem=f"score {score} is outside score_range {list(self.score_range)}")
        return _Judgement(OK, score, reply)

    def _reply(self, text: str) -> str:
        """The judge's reply text to ``text``."""
        common = {"model": self.model, "max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.api == "chat":
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            body = self._post("/chat/completions", {**common, "messages": [*messages, {"role": "user",
                                                                                        "content": text}]})
            return body["choices"][0]["message"]["content"] or ""
        return self._post("/completions", {**common, "prompt": text})["choices"][0]["text"]

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        import httpx

        for attempt in range(self.max_retries + 1):
            try:
                response = self.http.post(self.base_url + path, json=payload)
            except httpx.TimeoutException:
                raise
            except httpx.TransportError:
                if attempt == self.max_retries:
                    raise
                time.sleep(0.2 * 2 ** attempt)
                continue
            if response.status_code in _RETRIED_STATUSES and attempt < self.max_retries:
                time.sleep(0.2 * 2 ** attempt)
                continue
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code} from {self.base_url + path}: {response.text[:200]}")
            return response.json()
        raise AssertionError("unreachable")  # pragma: no cover

    def _served_model(self) -> str:
        """The first model the endpoint lists (``ValueError`` naming ``reward_judge.model`` when it lists none)."""
        import httpx

        try:
            listed = self.http.get(self.base_url + "/models").json().get("data", [])
        except (httpx.HTTPError, ValueError) as failure:
            raise ValueError(f"{KEY}: the judge at {self.base_url} does not answer GET /models ({failure}); is it "
                             f"running, and is base_url its /v1 root? Or set {KEY}.model") from None
        if not listed:
            raise ValueError(f"{KEY}: the judge at {self.base_url} lists no model; set {KEY}.model")
        return str(listed[0]["id"])

"""The judge of ``reward_judge.model_path``: ``hybridrl serve`` in a process of its own, for the length of a run.

Its own process keeps the judge's engine (and vLLM's global patching) out of the controller and the trainer's
workers. It listens on a free loopback port; :class:`ServedJudge` waits for its "at http://…" line, hands out the
``/v1`` root, and stops it (SIGTERM, then SIGKILL) when the run ends, or when the controller exits.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

from hybridrl.rewards.judge import JudgeClient, JudgeError

__all__ = ["ServedJudge", "open_judge", "judge_for_run"]

logger = logging.getLogger(__name__)

_READY = re.compile(r"^hybridrl serve: .* at (http://\S+) \(Ctrl-C stops\)")


class ServedJudge:
    """Start ``hybridrl serve model_path`` in a session of its own (so stopping it stops its engine's processes too)
    and wait until it listens (:class:`JudgeError` with its last output if it exits or is not up within
    ``start_timeout_s``)."""

    def __init__(self, model_path: str, *, dtype: str = "bfloat16", max_model_len: int = 2048,
                 max_tokens: int = 64, start_timeout_s: float = 600.0) -> None:
        command = [sys.executable, "-m", "hybridrl.cli", "serve", model_path, "--port", "0", "--served-model-name",
                   "judge", "--dtype", dtype, "--max-model-len", str(max_model_len), "--max-tokens", str(max_tokens)]
        self.model_path = model_path
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="replace", bufsize=1, start_new_session=True)
        self.output: deque[str] = deque(maxlen=40)
        self._url: Optional[str] = None
        self._ready = threading.Event()
        threading.Thread(target=self._read_output, name="judge-server-output", daemon=True).start()
        atexit.register(self.close)
        started = time.perf_counter()
        while not self._ready.wait(0.5):
            if self.process.poll() is not None or time.perf_counter() - started > start_timeout_s:
                self.close()
                raise JudgeError(f"reward_judge.model_path={model_path!r}: the judge's server did not start within "
                                 f"{start_timeout_s:.0f} s (exit code {self.process.returncode}); its last output:\n"
                                 + "".join(self.output))
        logger.info("reward_judge: serving %s at %s (started in %.0f s)", model_path, self.base_url,
                    time.perf_counter() - started)

    @property
    def base_url(self) -> str:
        """The judge's ``/v1`` root."""
        assert self._url is not None
        return self._url + "/v1"

    def _read_output(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            match = _READY.search(line) if self._url is None else None
            if match:
                self._url = match.group(1).rstrip("/").removesuffix("/v1")
                self._ready.set()

    def diagnose(self) -> str:
        """Why the judge may not answer: ``""`` while the server runs, else its exit code and last output."""
        if self.process.poll() is None:
            return ""
        return (f"; the judge's server ({self.model_path}) exited with code {self.process.returncode}, its last "
                "output:\n" + "".join(self.output))

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the server and every process of its session: SIGTERM, then SIGKILL (idempotent)."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
        self._signal(signal.SIGKILL)  # what the server left behind (an engine process), if anything
        atexit.unregister(self.close)

    def _signal(self, number: int) -> None:
        try:
            os.killpg(self.process.pid, number)
        except (ProcessLookupError, PermissionError):
            pass


def open_judge(judge) -> JudgeClient:
    """The client of the ``reward_judge`` section ``judge``: to its ``base_url``, or to a :class:`ServedJudge` of its
    ``model_path`` started now and stopped by the client's ``close``."""
    if not judge.model_path:
        return JudgeClient.from_config(judge, judge.base_url)
    server = ServedJudge(judge.model_path, dtype=judge.serve_dtype, max_model_len=judge.serve_max_model_len,
                         max_tokens=judge.max_tokens, start_timeout_s=judge.serve_start_timeout_s)
    try:
        client = JudgeClient.from_config(judge, server.base_url)
    except BaseException:
        server.close()
        raise
    client.closers.append(server.close)
    client.diagnose = server.diagnose
    return client


@contextmanager
def judge_for_run(judge) -> Iterator[Optional[JudgeClient]]:
    """The run's judge client (``None`` when ``judge.enable`` is off), opened before any worker starts — a judge
    that is not there stops the run first — kept across worker restarts, and closed (its server stopped) at the end."""
    if not judge.enable:
        yield None
        return
    client = open_judge(judge)
    try:
        yield client
    finally:
        client.close()

"""The producer of the one step pipeline: each step's batch, drawn and generated up to η steps ahead of training
(``async_training``: the standalone rollout pool generates while the trainer trains). Synchronous training is η = 0:
a step's batch is drawn and generated when the step takes it, with the weights of the last update.

Versions. The weights of training step ``v`` are those the trainer holds when step ``v`` starts (``v`` optimizer
updates in); a row generated with them has ``policy_version = v``. A row trained at step ``t`` has staleness
``t − v``. The contract, for a bound η (``async_training.staleness_bound``):

- **admission**: when step ``t`` starts, the batches of steps up to ``t + η`` not yet submitted are submitted. The
  trainer syncs after every update, so by then the pool holds (or has queued) the weights of step ``t``: a batch of
  step ``s`` submitted at step ``t >= s − η`` is generated with them and trained at ``s``, staleness ``s − t <= η``.
  No timing enters: a replica runs the controller's calls in order (generate, then load, then generate …), so which
  weights produce a batch follows from the order of calls. (A step without an actor update — ``critic_warmup`` —
  leaves the weights as they are: ``Generation.advance`` relabels them as the next step's.)
- **check**: :meth:`RolloutQueue.take` refuses (``StalenessBoundError``) a batch with a row older than the bound —
  it cannot happen by the rule above; the check makes a mistake loud. The replicas, for their part, refuse to
  generate from weights other than the ones the controller names (``RolloutWorker.generate_sequences``).
- **η = 0** is the synchronous loop exactly: each batch is submitted after the sync it waits for, with the same
  prompts and seeds — the same run bit for bit.
- **checkpoints**: :meth:`state_dict` waits for the batches in flight and saves them with their versions; a resumed
  run takes them exactly as the uninterrupted run would have, and draws the next prompts from the loader's saved
  position. Nothing is regenerated, so nothing depends on weights the checkpoint no longer has.
- **lost replicas**: a chunk whose replica died is resubmitted to a live one (``PendingGeneration``) and generated
  once, with the weights that replica then holds (never older than planned): no sample is lost or counted twice.
- **ReMax**: each prompt's greedy response, the baseline, is submitted right behind its batch, so it comes from the
  weights that sampled the batch — as in a synchronous step, where it is generated before the update.
- **prompt replay**: a batch's prompts are drawn, and mixed with replayed ones, when it is submitted — by the buffer
  as the steps trained so far left it (with η = 0 exactly the synchronous step's draw).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from hybridrl.protocol import Batch, Fields
from hybridrl.protocol.state import batch_from_state, batch_state
from hybridrl.rollout.base import SamplingParams
from hybridrl.trainers.generation import Generation, PendingGeneration


SAMPLE_LOG_STEPS = 1024


class StalenessBoundError(RuntimeError):
    """A batch would train on rows older than ``async_training``'s bound (a broken contract, never expected)."""


@dataclass
class QueuedBatch:
    """The batch of training step ``step``: its sampling parameters, and the generation (or its rows); with ReMax
    also its prompts' greedy responses (``greedy``)."""

    step: int
    params: SamplingParams
    prompt_uids: list[str]
    pending: Optional[PendingGeneration] = None
    draw_metrics: dict[str, float] = field(default_factory=dict)  # the prompt draw's (replay/share …)
    rows: Optional[Batch] = None
    greedy: Optional[PendingGeneration | Batch] = None

    def result(self) -> Batch:
        if self.rows is None:
            assert self.pending is not None
            self.rows, self.pending = self.pending.result(), None
        return self.rows

    def greedy_result(self) -> Optional[Batch]:
        """The greedy responses (one row per prompt), or ``None`` when none were asked for."""
        if isinstance(self.greedy, PendingGeneration):
            self.greedy = self.greedy.result()
        return self.greedy


class RolloutQueue:
    """The batches generated ahead of the trainer (see the module docstring).

    Args:
        generation: who generates (``Generation``: the standalone pool, or with η = 0 the colocated engines).
        bound: η, the largest staleness a row may be trained at.
        draw_prompts: ``step`` → the step's prompts (the train loader's next batch, replayed prompts mixed in) and
            the draw's metrics; called once per step, in step order.
        params_for: the sampling parameters of a step's batch (its seed comes from the step).
        sample_log: where each take appends ``(step, prompt uids drawn, row uids, row policy versions)`` (bounded;
            for debugging and the contract tests: every drawn prompt trained once, with its ``rollout.n`` rows).
        greedy_params: (ReMax) also generate each batch's prompts with these, right behind the batch.
    """

    def __init__(self, generation: Generation, bound: int, draw_prompts: Callable[[int], tuple[Batch, dict]],
                 params_for: Callable[[int], SamplingParams], sample_log: Optional[deque] = None,
                 greedy_params: Optional[SamplingParams] = None) -> None:
        self.generation, self.bound, self.greedy_params = generation, bound, greedy_params
        self.sample_log = sample_log if sample_log is not None else deque(maxlen=SAMPLE_LOG_STEPS)
        self.draw_prompts, self.params_for = draw_prompts, params_for
        self.queued: dict[int, QueuedBatch] = {}
        self.next_step: Optional[int] = None  # the first step not yet drawn; None: start at the first take

    def admit(self, step: int) -> None:
        """Submit the batches of steps up to ``step + bound`` not yet submitted — also past the run's last step: those
        are saved with the final checkpoint, so a run resumed with more ``trainer.total_training_steps`` goes on
        exactly as one longer run would (the cost: η batches generated and, if the run is not extended, unused)."""
        if self.next_step is None:
            self.next_step = step
        while self.next_step <= step + self.bound:
            (prompts, draw_metrics), params = self.draw_prompts(self.next_step), self.params_for(self.next_step)
            entry = QueuedBatch(self.next_step, params, list(prompts[Fields.UID]),
                                self.generation.submit(prompts, params), draw_metrics=draw_metrics)
            if self.greedy_params is not None:  # queued behind the batch: the same weights generate it
                entry.greedy = self.generation.submit(prompts, self.greedy_params)
            self.queued[self.next_step] = entry
            self.next_step += 1

    def take(self, step: int) -> tuple[QueuedBatch, dict[str, float]]:
        """Step ``step``'s batch (waiting for it if it is still being generated) and the queue's metrics."""
        self.admit(step)
        if step not in self.queued:
            raise RuntimeError(f"no batch was queued for step {step} (queued: {sorted(self.queued)})")
        entry = self.queued.pop(step)
        started = time.perf_counter()
        rows = entry.result()
        waited = time.perf_counter() - started
        versions = rows[Fields.POLICY_VERSION]
        greedy = entry.greedy_result()
        if greedy is not None and set(greedy[Fields.POLICY_VERSION].tolist()) != set(versions.tolist()):
            raise StalenessBoundError(f"step {step}: the ReMax baseline was generated with the weights of versions "
                                      f"{sorted(set(greedy[Fields.POLICY_VERSION].tolist()))}, its rows with "
                                      f"{sorted(set(versions.tolist()))}")
        self.sample_log.append((step, entry.prompt_uids, list(rows[Fields.UID]), versions.tolist()))
        staleness = step - versions
        if int(staleness.max()) > self.bound or int(staleness.min()) < 0:
            raise StalenessBoundError(f"step {step}: rows generated with the weights of steps "
                                      f"{sorted(set(versions.tolist()))}, outside the bound "
                                      f"async_training staleness <= {self.bound}")
        return entry, {**staleness_metrics(staleness, self.bound), **partial_metrics(rows, step),
                       "async/trainer_wait_s": waited, "async/queue_depth": float(len(self.queued))}

    def state_dict(self) -> dict:
        """The batches queued for later steps, each waited for and saved with its rows (a checkpoint's part)."""
        return {"next_step": self.next_step,
                "batches": [{"step": entry.step, "prompt_uids": entry.prompt_uids, "rows": batch_state(entry.result()),
                             "draw_metrics": entry.draw_metrics,
                             **({"greedy": batch_state(entry.greedy_result())} if entry.greedy is not None else {})}
                            for entry in self.queued.values()]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s batches: taken later exactly as saved (never regenerated)."""
        self.next_step = state["next_step"]
        self.queued = {int(saved["step"]): QueuedBatch(
            int(saved["step"]), self.params_for(int(saved["step"])), list(saved["prompt_uids"]),
            rows=with_current_field_names(batch_from_state(saved["rows"])),
            greedy=batch_from_state(saved["greedy"]) if "greedy" in saved else None,
            draw_metrics=dict(saved.get("draw_metrics", {}))) for saved in state["batches"]}


LEGACY_FIELD_NAMES = {"weight_version": Fields.POLICY_VERSION, "token_weight_versions": Fields.TOKEN_POLICY_VERSIONS}
"""Names the version fields had before one ``policy_version`` (checkpoints written then hold rows under them)."""


def with_current_field_names(rows: Batch) -> Batch:
    """``rows`` with fields saved under :data:`LEGACY_FIELD_NAMES` moved to their current names (same values)."""
    for old, new in LEGACY_FIELD_NAMES.items():
        if old in rows and new not in rows:
            rows[new] = rows.pop(old)[old]
    return rows


def staleness_metrics(staleness: torch.Tensor, bound: int) -> dict[str, float]:
    """``async/staleness_mean|max`` and the histogram ``async/staleness_frac_<k>`` (share of rows at each k <= η)."""
    values = staleness.to(torch.float64)
    histogram = {f"async/staleness_frac_{k}": float((staleness == k).to(torch.float64).mean())
                 for k in range(bound + 1)}
    return {"async/staleness_mean": float(values.mean()), "async/staleness_max": float(values.max()), **histogram}


def partial_metrics(rows: Batch, step: int) -> dict[str, float]:
    """Partial rollout: ``async/partial_rows`` (the share of rows whose tokens come from more than one version) and
    ``async/token_staleness_mean`` (over generated tokens; below the row staleness when weights landed mid-row)."""
    if Fields.TOKEN_POLICY_VERSIONS not in rows:
        return {}
    versions = rows[Fields.TOKEN_POLICY_VERSIONS]
    valid = versions >= 0
    newest = torch.where(valid, versions, -1).max(-1).values
    spans = valid.any(-1) & (newest != rows[Fields.POLICY_VERSION])
    token_staleness = (step - versions)[valid].to(torch.float64)
    return {"async/partial_rows": float(spans.to(torch.float64).mean()),
            "async/token_staleness_mean": float(token_staleness.mean()) if token_staleness.numel() else 0.0}


def refuse_a_queue_outside_the_bound(checkpoint: Optional[Path], bound: int, mode: str) -> None:
    """Before any worker starts: ``ValueError`` when the checkpoint a run resumes from holds batches generated ahead
    (an asynchronous run's queue) that this run's bound would refuse at their step — e.g. a ``one_step_off``
    checkpoint resumed with ``async_training.mode=sync`` (η = 0), which raised ``StalenessBoundError`` mid-run."""
    if checkpoint is None:
        return
    from hybridrl.trainers.checkpoints import load_trainer_state

    for saved in load_trainer_state(checkpoint).get("rollout_queue", {}).get("batches", []):
        versions = with_current_field_names(batch_from_state(saved["rows"]))[Fields.POLICY_VERSION]
        staleness = int(saved["step"]) - int(versions.min())
        if staleness > bound:
            raise ValueError(
                f"{checkpoint} holds the batch of step {saved['step']}, generated ahead with the weights of step "
                f"{int(versions.min())} (staleness {staleness}) by an asynchronous run; async_training.mode={mode} "
                f"allows staleness <= {bound}: resume with the async_training settings the checkpoint was written "
                "with, or start afresh (trainer.resume_mode=disable)")

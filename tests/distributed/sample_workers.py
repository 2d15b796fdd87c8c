"""Worker classes the distributed tests start in Ray actors (importable there: the tests put this folder on the
workers' PYTHONPATH through ``trainer.ray.worker_env``). Light on purpose: a rank that unpickles one imports this
module, and the trainer's own workers (``hybridrl.workers``) take seconds to import."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.runtime import Worker, dp_leaders, dp_split, one_to_all, rank_zero
from hybridrl.protocol import Batch


def make_batch(rows: int, width: int = 3) -> Batch:
    """``x``: ``[rows, width]`` float, row ``i`` filled with ``i``; ``ids``: ``[rows]`` int64; ``tag``: strings."""
    x = torch.arange(rows, dtype=torch.float32).unsqueeze(1).repeat(1, width)
    return Batch(tensors={"x": x, "ids": torch.arange(rows)}, non_tensors={"tag": [f"row{i}" for i in range(rows)]})


class EchoWorker(Worker):
    """Small methods exercising every dispatch mode, collectives and failures."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.last_rows: list[int] = []

    @one_to_all
    def rank_info(self) -> dict[str, int]:
        return {"rank": self.rank, "world_size": self.world_size, "dp_rank": self.context.dp_rank,
                "tp_rank": self.context.tp_rank, "pid": os.getpid(), "threads": torch.get_num_threads(),
                "pg_world": dist.get_world_size() if dist.is_initialized() else 0}

    @one_to_all(collect="first")
    def all_reduce_sum(self, value: float) -> float:
        tensor = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(tensor)
        return float(tensor.item())

    @one_to_all
    def mesh_shapes(self) -> dict[str, list[int]]:
        assert self.dp_mesh is not None and self.rollout_mesh is not None
        tp_group = self.rollout_mesh.get_group("tp")
        peers = [0] * dist.get_world_size(tp_group)
        dist.all_gather_object(peers, self.rank, group=tp_group)
        return {"dp": list(self.dp_mesh.shape), "rollout": list(self.rollout_mesh.shape), "tp_peers": peers}

    @dp_split
    def add_offset(self, batch: Batch, scale: float = 1.0) -> Batch:
        """Row-wise: ``y = x * scale + offset``, plus the rank that computed each row."""
        self.last_rows = batch["ids"].tolist()
        return Batch(tensors={"y": batch["x"] * scale + self.offset, "rank": torch.full((len(batch),), self.rank),
                              "ids": batch["ids"].clone()}, non_tensors={"tag": list(batch["tag"])})

    @dp_split(pad=False)
    def count_rows(self, batch: Batch) -> int:
        return len(batch)

    @dp_leaders
    def leader_echo(self, batch: Batch) -> Batch:
        self.last_rows = batch["ids"].tolist()
        return Batch(tensors={"ids": batch["ids"].clone(), "rank": torch.full((len(batch),), self.rank)})

    @one_to_all
    def seen_rows(self) -> list[int]:
        return self.last_rows

    @rank_zero
    def whoami(self, tag: str) -> tuple[str, int]:
        return tag, self.rank

    @one_to_all
    def pid(self) -> int:
        return os.getpid()

    @one_to_all
    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @one_to_all
    def sleep_marked(self, seconds: float, marker_dir: str) -> float:
        """Sleep, having first created ``<marker_dir>/rank<r>``: a test can wait for the call to be running."""
        (Path(marker_dir) / f"rank{self.rank}").touch()
        time.sleep(seconds)
        return seconds

    @one_to_all
    def sleep_span(self, seconds: float) -> tuple[float, float]:
        """Sleep; returns when this rank started and ended (``time.time()``: one clock for every process here)."""
        started = time.time()
        time.sleep(seconds)
        return started, time.time()

    @one_to_all
    def die_on(self, rank: int) -> None:
        """``rank`` exits hard; the others block in an all-reduce it never joins (a crash mid-collective)."""
        if self.rank == rank:
            os._exit(1)
        dist.all_reduce(torch.ones(1))

    @one_to_all
    def raise_on(self, rank: int, then_collective: bool = False) -> int:
        if self.rank == rank:
            raise ValueError(f"bad input seen by rank {rank}")
        if then_collective:
            dist.all_reduce(torch.ones(1))
        return self.rank


    @one_to_all
    def set_env(self, name: str, value: str) -> None:
        os.environ[name] = value

    @one_to_all
    def get_env(self, name: str) -> str | None:
        return os.environ.get(name)

    @one_to_all
    def start_thread(self, seconds: float) -> None:
        """A thread that outlives the call (and the worker, if it is shut down first)."""
        threading.Thread(target=time.sleep, args=(seconds,), name="left-running", daemon=True).start()


class EngineLoadingWorker(EchoWorker):
    """Stands for a worker that loads vLLM into its process: says so (``process_profile``) and leaves the module
    ``vllm`` in ``sys.modules``, which is all the process check reads (the real engine's parking is covered by the
    runs that start it)."""

    @classmethod
    def process_profile(cls, *args, **kwargs) -> str:
        return "vllm"

    def __init__(self, offset: float = 0.0) -> None:
        super().__init__(offset)
        sys.modules.setdefault("vllm", types.ModuleType("vllm"))


class FailingInitWorker(Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise RuntimeError("cannot build the model on this rank")


# --- a colocated hybrid-engine worker: actor, rollout and reference roles share one model per process ------------


class TinyPolicy(nn.Module):
    def __init__(self, vocab: int = 16, hidden: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))  # [batch, seq, vocab] logits


class RolloutRole:
    def __init__(self, model: TinyPolicy) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: Batch) -> Batch:
        """Greedy next token for every prompt position: ``responses`` ``[batch, seq]``."""
        logits = self.model(prompts["input_ids"])
        return Batch(tensors={"input_ids": prompts["input_ids"].clone(), "responses": logits.argmax(-1)})


class ReferenceRole:
    def __init__(self, model: TinyPolicy) -> None:
        self.model = model

    @torch.no_grad()
    def log_prob(self, batch: Batch) -> torch.Tensor:
        """Log-probs of ``responses`` under the model, ``[batch, seq]`` in nats."""
        log_probs = torch.log_softmax(self.model(batch["input_ids"]), dim=-1)
        return log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


class ActorRole:
    def __init__(self, model: TinyPolicy, lr: float) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def update(self, batch: Batch, world_size: int) -> float:
        """One SGD step raising the log-prob of ``responses``; gradients averaged over DP ranks by all-reduce."""
        log_probs = torch.log_softmax(self.model(batch["input_ids"]), dim=-1)
        loss = -log_probs.gather(-1, batch["responses"].unsqueeze(-1)).mean()
        self.optimizer.zero_grad()
        loss.backward()
        for param in self.model.parameters():
            if world_size > 1:
                dist.all_reduce(param.grad)
                param.grad /= world_size
        self.optimizer.step()
        return float(loss.item())


class ActorRolloutRefWorker(Worker):
    """The hybrid engine on one device: three roles, one ``TinyPolicy`` object, one process."""

    def __init__(self, seed: int = 0, lr: float = 0.5) -> None:
        torch.manual_seed(seed)
        self.model = TinyPolicy()
        self.actor = ActorRole(self.model, lr)
        self.rollout = RolloutRole(self.model)
        self.ref = ReferenceRole(self.model)

    @dp_split
    def generate_sequences(self, prompts: Batch) -> Batch:
        return self.rollout.generate(prompts)

    @dp_split
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return Batch(tensors={"ref_log_probs": self.ref.log_prob(batch)})

    @dp_split(pad=False)
    def update_actor(self, batch: Batch) -> float:
        return self.actor.update(batch, self.world_size)

    @one_to_all
    def model_identity(self) -> dict[str, Any]:
        """``id()`` and first-parameter ``data_ptr()`` of each role's model, and a weight checksum."""
        roles = (self.actor.model, self.rollout.model, self.ref.model)
        checksum = sum(float(p.detach().double().sum()) for p in self.model.parameters())
        return {"id": [id(m) for m in roles], "data_ptr": [m.head.weight.data_ptr() for m in roles],
                "checksum": checksum}


class ValueWorker(Worker):
    """A critic-like role for split placement: its own pool, its own processes."""

    def __init__(self) -> None:
        torch.manual_seed(1)
        self.head = nn.Linear(1, 1)

    @dp_split
    def compute_values(self, batch: Batch) -> Batch:
        with torch.no_grad():
            values = self.head(batch["input_ids"].float().unsqueeze(-1)).squeeze(-1)
        return Batch(tensors={"values": values})

    @one_to_all
    def pid(self) -> int:
        return os.getpid()

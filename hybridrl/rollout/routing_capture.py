"""The experts a mixture-of-experts model routed each token to while it generated (R3's record), in the rollout
layout: ``Fields.ROUTED_EXPERTS [B·n, P + R, routers, k]`` aligned with ``input_ids``, ``-1`` where no forward ran the token
(padding; the last sampled token, which is never fed back). The trainer replays it (:mod:`hybridrl.modeling.
routing_replay`), so the experts behind a trained log-prob are the ones behind the sampled token.

Records the generation's own calls: the shared prompt prefill (one prompt, its ``n`` samples), then each decode
step's rows still running, KV cache and all — not a second full forward, whose routing can differ at near-ties.
"""

from __future__ import annotations

import torch

from hybridrl.protocol import Batch, Fields

class RoutingCapture:
    """Places a chunk's router calls (``record[router]``: the ``[T, k]`` indices of each call, from
    :func:`~hybridrl.modeling.routing_replay.recorded_routing`) at their rows and columns of ``experts [rows, width,
    routers, k]``."""

    def __init__(self, record: list[list[torch.Tensor]], rows: int, width: int, top_k: int) -> None:
        self.record = record
        self.experts = torch.full((rows, width, len(record), top_k), -1, dtype=torch.int16)

    def place(self, rows: torch.Tensor, end: int, repeat: int = 1) -> None:
        """The calls since the last ``place`` ran rows ``rows [A]`` (or, with ``repeat``, prompts whose ``repeat``
        samples are rows ``a·repeat … a·repeat + repeat − 1``) over the columns that end at ``end``."""
        prompts = len(rows)
        rows = (rows.cpu().unsqueeze(1) * repeat + torch.arange(repeat)).flatten()
        for router, calls in enumerate(self.record):
            chosen = torch.cat(calls).to(torch.int16).cpu()
            calls.clear()
            chosen = chosen.view(prompts, -1, chosen.shape[-1]).repeat_interleave(repeat, 0)
            columns = torch.arange(end - chosen.shape[1], end)
            self.experts[rows.unsqueeze(1), columns.unsqueeze(0), router] = chosen


def with_routing(rollout: Batch, experts: torch.Tensor) -> Batch:
    """``rollout`` with its ``Fields.ROUTED_EXPERTS``: ``experts [B·n, P + R', routers, k]`` cut or padded to the
    rollout's ``P + R`` columns, ``-1`` wherever the attention mask is 0."""
    width = rollout[Fields.INPUT_IDS].shape[1]
    if experts.shape[1] < width:
        fill = experts.new_full((experts.shape[0], width - experts.shape[1], *experts.shape[2:]), -1)
        experts = torch.cat([experts, fill], dim=1)
    experts = experts[:, :width].masked_fill(~rollout[Fields.ATTENTION_MASK].bool().cpu()[..., None, None], -1)
    return rollout.union(Batch(tensors={Fields.ROUTED_EXPERTS: experts}))

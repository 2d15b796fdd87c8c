"""Prompt replay on the controller: prompts round-trip through the buffer exactly, priorities are the groups' score
spreads, replayed prompts get fresh uids, and the buffer state survives a weights-only checkpoint."""

from __future__ import annotations

import io
import statistics

import torch

from hybridrl.trainers.continual import PromptReplay, prompt_items
from hybridrl.data.dataset import TokenizedPrompt
from hybridrl.data.loader import collate_prompts
from hybridrl.protocol import Fields
from hybridrl.protocol.rollout_layout import assemble_rollout

PAD, N = 0, 3


def prompt_batch(first: int, count: int, tag: str):
    """``count`` prompts of different lengths (2..4 tokens), uids ``<tag>-<i>``."""
    prompts = [TokenizedPrompt(row_id=i, input_ids=tuple(range(5 + i, 5 + i + 2 + i % 3)), raw_prompt=f"p{i}",
                               data_source="arithmetic", ground_truth=str(i), extra_info={"index": i})
               for i in range(first, first + count)]
    return collate_prompts(prompts, [f"{tag}-{i}" for i in range(count)], PAD)


def scored_rollout(prompts, scores):
    """The rollout of ``prompts`` with ``N`` one-token responses each, sequence scores ``scores`` ``[G][N]``."""
    rows = len(prompts) * N
    rollout = assemble_rollout(prompts, N, torch.full((rows, 2), 3), torch.tensor([[1, 0]] * rows),
                               torch.zeros(rows, 2), PAD)
    token_scores = torch.zeros(rows, 2)
    token_scores[:, 0] = torch.tensor([score for group in scores for score in group], dtype=torch.float32)
    rollout[Fields.TOKEN_LEVEL_SCORES] = token_scores
    return rollout


SCORES = [[1, 1, 1], [0, 1, 0], [1, 0, 1], [0, 0, 0]]  # spreads 0, 0.47, 0.47, 0


def test_observed_prompts_come_back_exactly_with_spread_priorities_and_fresh_uids():
    replay = PromptReplay(capacity=10, alpha=50.0, num_replayed=2, pad_token_id=PAD, seed=4)
    seen = prompt_batch(0, 4, "old")
    replay.observe(scored_rollout(seen, SCORES))
    priorities = {key: entry.priority for key, entry in replay.buffer.entries.items()}
    assert priorities == {f"p{g}": statistics.pstdev(SCORES[g]) for g in range(4)}

    fresh = prompt_batch(10, 4, "new")
    mixed, metrics = replay.mix(fresh, step=7)
    assert metrics == {"replay/share": 0.5, "replay/buffer_size": 4.0}
    assert list(mixed[Fields.UID]) == ["new-0", "new-1", "replay-s7-0", "replay-s7-1"]
    items = prompt_items(mixed)
    assert items[:2] == prompt_items(fresh)[:2]
    # alpha = 50: the two prompts whose groups disagreed are drawn; each exactly as first seen (ids and fields)
    assert sorted(item["raw_prompt"] for item in items[2:]) == ["p1", "p2"]
    originals = {item["raw_prompt"]: item for item in prompt_items(seen)}
    assert all(item == originals[item["raw_prompt"]] for item in items[2:])
    assert originals["p2"]["input_ids"] == [7, 8, 9, 10]  # unpadded, as the loader tokenised it


def test_empty_buffer_leaves_the_batch_alone_and_capacity_evicts_the_flattest_group():
    replay = PromptReplay(capacity=2, alpha=1.0, num_replayed=1, pad_token_id=PAD, seed=4)
    fresh = prompt_batch(0, 4, "new")
    same, metrics = replay.mix(fresh, step=0)
    assert same is fresh and metrics["replay/share"] == 0.0
    replay.observe(scored_rollout(fresh, SCORES))
    assert sorted(replay.buffer.entries) == ["p1", "p2"]


def test_buffer_state_round_trips_through_a_weights_only_checkpoint():
    replay = PromptReplay(capacity=10, alpha=1.0, num_replayed=2, pad_token_id=PAD, seed=4)
    replay.observe(scored_rollout(prompt_batch(0, 4, "old"), SCORES))
    buffer = io.BytesIO()
    torch.save({"replay": replay.state_dict()}, buffer)
    buffer.seek(0)
    restored = PromptReplay(capacity=10, alpha=1.0, num_replayed=2, pad_token_id=PAD, seed=4)
    restored.load_state_dict(torch.load(buffer, weights_only=True)["replay"])
    for step in range(3):
        expected, _ = replay.mix(prompt_batch(20, 4, "new"), step)
        again, _ = restored.mix(prompt_batch(20, 4, "new"), step)
        assert torch.equal(expected[Fields.INPUT_IDS], again[Fields.INPUT_IDS])
        assert prompt_items(expected) == prompt_items(again)

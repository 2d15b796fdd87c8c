"""An agent episode's several training sequences as rows (``agents/episode_rows.py``): each other sequence becomes a
row of exactly its ids, masks and rollout log-probs; unused rows hold no loss token; advantages are computed on the
episodes' own rows alone (a slow per-group reference) and every other row of an episode gets its episode's, whatever
order balancing put the rows in; an estimator that gives one episode's tokens different advantages is refused."""

from __future__ import annotations

import statistics

import pytest
import torch

from hybridrl.agents.batch import AGENT_STATS, AGENT_STATS_FIELD, EPISODE_SEQUENCES, trajectories_to_batch
from hybridrl.agents.episode_rows import (EPISODE_PART, EPISODE_ROW, episode_rows, episode_rows_metrics,
                                          episodes_only, shared_episode_advantages)
from hybridrl.agents.trajectory import SequenceIds, Trajectory
from hybridrl.config.schema import AlgorithmConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.trainers.rl_steps import compute_advantages

PAD, RESPONSE = 0, 6


def other(prompt, response, mask):
    return SequenceIds(list(prompt), list(response), list(mask), [-0.25 * m for m in mask])


def episodes() -> Batch:
    """Four episodes of two prompts: one split in three, one in two, two whole; rewards scored at the last id."""
    shapes = [((1, 2), [5, 6], (other([3], [7, 8, 9], [1, 0, 1]), other([4, 4], [10], [1]))),
              ((1, 2), [5], (other([3, 3, 3], [11, 12], [1, 1]),)),
              ((2,), [6, 6, 6], ()),
              ((2,), [7], ())]
    trajectories = []
    for prompt, response, others in shapes:
        trajectory = Trajectory(prompt_ids=list(prompt), other_sequences=others, agent_reward=1.0)
        trajectory.add_model_turn(response, [-0.5] * len(response), [0] * len(response))
        trajectories.append(trajectory)
    rows = Batch(non_tensors={Fields.UID: ["a", "a", "b", "b"]})
    batch = trajectories_to_batch(trajectories, rows, RESPONSE, PAD, prompt_width=4, agent_rewards=True)
    scores = torch.zeros(4, RESPONSE)
    for row, (value, length) in enumerate(zip([1.0, 0.0, 0.5, 2.0], [2, 1, 3, 1])):
        scores[row, length - 1] = value
    batch[Fields.TOKEN_LEVEL_SCORES] = batch[Fields.TOKEN_LEVEL_REWARDS] = scores
    batch[Fields.SCORES] = scores.sum(-1)
    return batch


def test_each_other_sequence_is_a_row_of_its_exact_ids_and_unused_rows_hold_no_loss():
    batch = episodes()
    rows = episode_rows(batch, 3, PAD)
    assert len(rows) == 12 and EPISODE_SEQUENCES not in rows
    assert rows[EPISODE_PART].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert rows[EPISODE_ROW].tolist() == [0, 1, 2, 3] * 3
    for key in (Fields.INPUT_IDS, Fields.RESPONSE_MASK, Fields.TOKEN_LEVEL_SCORES, Fields.SCORES):
        assert torch.equal(rows[key][:4], batch[key])  # the episodes' own rows as they were
    expected = {4: other([3], [7, 8, 9], [1, 0, 1]), 8: other([4, 4], [10], [1]), 5: other([3, 3, 3], [11, 12], [1, 1])}
    for row, sequence in expected.items():
        prompt = rows[Fields.PROMPTS][row][rows[Fields.ATTENTION_MASK][row, :4].bool()].tolist()
        length = len(sequence.response_ids)
        assert prompt == list(sequence.prompt_ids)
        assert rows[Fields.RESPONSES][row, :length].tolist() == list(sequence.response_ids)
        assert rows[Fields.RESPONSE_MASK][row].tolist() == [*sequence.response_mask, *[0] * (RESPONSE - length)]
        assert rows[Fields.ROLLOUT_LOG_PROBS][row, :length].tolist() == list(sequence.log_probs)
        assert rows[Fields.TOKEN_LEVEL_SCORES][row].abs().sum() == 0  # the episode's score is on its own row
        assert rows[Fields.UID][row] == batch[Fields.UID][row % 4] and rows[Fields.SCORES][row] == batch[Fields.SCORES][
            row % 4]
    for row in (6, 7, 9, 10, 11):  # unused: one pad id of prompt, nothing else
        assert rows[Fields.ATTENTION_MASK][row].tolist() == [0, 0, 0, 1] + [0] * RESPONSE
        assert rows[Fields.RESPONSE_MASK][row].sum() == 0
    assert episode_rows_metrics(rows) == {"agent/trained_sequences": 7 / 4}
    own = episodes_only(rows.reorder(torch.randperm(12, generator=torch.Generator().manual_seed(0))))
    assert torch.equal(own.reorder(own[EPISODE_ROW].argsort())[Fields.INPUT_IDS], batch[Fields.INPUT_IDS])


def test_one_slot_keeps_the_batch_and_drops_the_other_sequences_it_cannot_train():
    batch = episodes()
    rows = episode_rows(batch, 1, PAD)
    assert len(rows) == 4 and EPISODE_SEQUENCES not in rows and EPISODE_PART not in rows
    assert torch.equal(episodes_only(rows)[Fields.INPUT_IDS], rows[Fields.INPUT_IDS])


def grpo_reference(scores: list[float], groups: list[str], epsilon: float = 1e-6) -> list[float]:
    values = {}
    for group in set(groups):
        members = [score for score, other_group in zip(scores, groups) if other_group == group]
        values[group] = (statistics.fmean(members), statistics.stdev(members))
    return [(score - values[group][0]) / (values[group][1] + epsilon) for score, group in zip(scores, groups)]


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_advantages_are_the_episodes_own_and_shared_by_their_other_rows_in_any_order(estimator):
    batch = episodes()
    algorithm = AlgorithmConfig(adv_estimator=estimator)
    own_advantages, _ = compute_advantages(episodes(), algorithm)
    rows = episode_rows(batch, 3, PAD)
    shuffled = rows.reorder(torch.randperm(len(rows), generator=torch.Generator().manual_seed(3)))
    advantages, returns = compute_advantages(shuffled, algorithm)
    mask = shuffled[Fields.RESPONSE_MASK].bool()
    for row in range(len(shuffled)):
        episode = int(shuffled[EPISODE_ROW][row])
        expected = own_advantages[episode][episodes()[Fields.RESPONSE_MASK][episode].bool()][0]
        assert advantages[row][mask[row]].tolist() == pytest.approx([float(expected)] * int(mask[row].sum()))
        assert advantages[row][~mask[row]].abs().sum() == 0 and torch.equal(returns[row], advantages[row])
    if estimator == "grpo":  # the slow reference: the groups' statistics saw each episode once
        firsts = [advantages[(shuffled[EPISODE_ROW] == episode) & (shuffled[EPISODE_PART] == 0)][0] for episode in
                  range(4)]
        got = [float(first[first != 0][0]) for first in firsts]
        assert got == pytest.approx(grpo_reference([1.0, 0.0, 0.5, 2.0], ["a", "a", "b", "b"]), rel=1e-5)


def test_an_estimator_with_an_advantage_per_token_cannot_share_it():
    rows = episode_rows(episodes(), 2, PAD)

    def per_token(own, positions):
        ramp = torch.arange(RESPONSE, dtype=torch.float32).expand(len(own), RESPONSE)
        return ramp * own[Fields.RESPONSE_MASK], ramp
    with pytest.raises(ValueError, match="agent_max_sequences > 1 .* episode row 0 different advantages"):
        shared_episode_advantages(rows, per_token)


def test_the_agent_stats_count_dropped_sequences():
    trajectory = Trajectory(prompt_ids=[1], counters={"split_sequences": 3.0, "dropped_sequences": 1.0})
    batch = trajectories_to_batch([trajectory], Batch(non_tensors={Fields.UID: ["a"]}), 2, PAD, agent_rewards=True)
    stats = dict(zip(AGENT_STATS, batch[AGENT_STATS_FIELD][0].tolist()))
    assert (stats["split_sequences"], stats["dropped_sequences"]) == (3.0, 1.0)


def test_dropping_sequences_is_said_once(caplog):
    from hybridrl.agents import episode_rows as module

    trajectory = Trajectory(prompt_ids=[1], counters={"dropped_sequences": 2.0})
    batch = trajectories_to_batch([trajectory], Batch(non_tensors={Fields.UID: ["a"]}), 2, PAD, agent_rewards=True)
    module._DROPPING_SAID.discard(7)
    with caplog.at_level("WARNING", logger=module.__name__):
        episode_rows(batch, 7, PAD)
        episode_rows(trajectories_to_batch([trajectory], Batch(non_tensors={Fields.UID: ["a"]}), 2, PAD,
                                           agent_rewards=True), 7, PAD)
    said = [record.getMessage() for record in caplog.records if "agent_max_sequences" in record.getMessage()]
    assert len(said) == 1 and "1 of 1 agent episodes split into more than 7" in said[0]


def test_remax_asks_no_greedy_baseline_for_a_failed_agent_episode():
    """A failed episode's row is a group of its own (``out_of_groups``) with nothing to train: ReMax generates no
    greedy response for it, and its baseline is 0; the other rows get their prompt's greedy score."""
    from hybridrl.agents.batch import EPISODE_FAILURE, out_of_groups
    from hybridrl.config import load_config
    from hybridrl.trainers.variants import prompts_without_greedy, remax_baselines

    batch = episodes()
    failures = ["", "the agent's own bug", "", ""]
    batch = Batch(tensors=dict(batch.tensors), non_tensors={**dict(batch.non_tensors), EPISODE_FAILURE: failures})
    batch[Fields.RESPONSE_MASK][1] = 0
    batch = out_of_groups(batch)
    missing = prompts_without_greedy(batch, None)
    assert list(missing[Fields.UID]) == ["a", "b"]
    greedy = missing.select(Fields.UID)
    greedy[Fields.INPUT_IDS] = missing[Fields.INPUT_IDS]
    scores = {"a": 0.25, "b": 0.75}

    def token_level_scores(rows):
        return torch.tensor([[scores[uid]] for uid in rows[Fields.UID]]), {}
    config = load_config(["algorithm.adv_estimator=remax"], check_paths=False)
    assert remax_baselines(batch, [greedy], config, token_level_scores).tolist() == [0.25, 0.0, 0.75, 0.75]


def test_the_other_sequences_ride_as_plain_values_through_a_checkpoint(tmp_path):
    """Asynchronous training saves the batches in flight with its checkpoints (``batch_state``, loaded back with
    ``weights_only``): an agent batch's other sequences survive, and unfold the same after loading."""
    from hybridrl.modeling.safe_load import load_tensors
    from hybridrl.protocol.state import batch_from_state, batch_state

    batch = episodes()
    torch.save(batch_state(batch), tmp_path / "state.pt")
    loaded = batch_from_state(load_tensors(tmp_path / "state.pt"))
    before, after = episode_rows(episodes(), 3, PAD), episode_rows(loaded, 3, PAD)
    for key in (Fields.INPUT_IDS, Fields.RESPONSE_MASK, Fields.ROLLOUT_LOG_PROBS, EPISODE_PART, EPISODE_ROW):
        assert torch.equal(before[key], after[key]), key


def test_a_width_that_equals_the_response_length_is_not_taken_for_tokens():
    """``agent_stats`` has as many columns as the responses here (10): it is the episode's, copied, not zeroed."""
    trajectory = Trajectory(prompt_ids=[1], other_sequences=(other([2], [3], [1]),), counters={"turns": 1.0})
    trajectory.add_model_turn([5, 6], [-0.5, -0.5], [0, 0])
    batch = trajectories_to_batch([trajectory], Batch(non_tensors={Fields.UID: ["a"]}), len(AGENT_STATS), PAD,
                                  agent_rewards=True)
    rows = episode_rows(batch, 2, PAD)
    assert torch.equal(rows[AGENT_STATS_FIELD][1], rows[AGENT_STATS_FIELD][0])


def test_remax_baselines_follow_the_episodes_own_rows_through_any_order():
    """ReMax's per-row baselines (``reward_baselines``, one per row of the unfolded batch) are read at the episodes'
    own rows, whatever order balancing left them in: every row gets its episode's return minus its baseline."""
    algorithm = AlgorithmConfig(adv_estimator="remax")
    baselines = {"a": 0.25, "b": 1.0}
    own, _ = compute_advantages(episodes(), algorithm, torch.tensor([baselines[uid] for uid in "aabb"]))
    rows = episode_rows(episodes(), 3, PAD)
    shuffled = rows.reorder(torch.randperm(len(rows), generator=torch.Generator().manual_seed(5)))
    per_row = torch.tensor([baselines[uid] for uid in shuffled[Fields.UID]])
    advantages, _ = compute_advantages(shuffled, algorithm, per_row)
    mask = shuffled[Fields.RESPONSE_MASK].bool()
    for row in range(len(shuffled)):
        episode = int(shuffled[EPISODE_ROW][row])
        expected = float(own[episode][episodes()[Fields.RESPONSE_MASK][episode].bool()][0])
        assert advantages[row][mask[row]].tolist() == pytest.approx([expected] * int(mask[row].sum()))
    assert {round(float(own[e][0]), 4) for e in range(4)} == {0.75, -0.25, -0.5, 1.0}

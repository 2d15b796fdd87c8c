"""Multi-turn demonstrations and trajectories as rollout rows (``agents/conversation.py``, ``agents/batch.py``), and
the ``tool_arithmetic`` task's SFT view."""

from __future__ import annotations

import pytest
import torch

from hybridrl.agents.batch import (AGENT_STATS, EPISODE_REWARDS, FINAL_RESPONSE, TURN_REWARDS, agent_metrics,
                                   trajectories_to_batch)
from hybridrl.agents.conversation import encode_conversations
from hybridrl.agents.builtin_tools import BUILTIN_TOOLS
from hybridrl.agents.tools import format_tool_call
from hybridrl.agents.trajectory import Trajectory
from hybridrl.data import build_synthetic_task
from hybridrl.data.sft import SFTExample
from hybridrl.data.tool_arithmetic import tool_call_text
from hybridrl.protocol import Batch, Fields
from hybridrl.utils.tiny_model import build_char_tokenizer

TOOLS = [BUILTIN_TOOLS["calculator"].schema()]


def test_the_tasks_tool_call_is_the_agents_format():
    assert tool_call_text("12*34") == format_tool_call("calculator", {"expression": "12*34"})


def test_demonstrations_train_on_assistant_turns_only():
    """A tool-using demonstration: loss on the call and on the answer (each up to its EOS), none on the tool's reply;
    attention on everything; the final answer is the row's final_response."""
    tokenizer = build_char_tokenizer(tool_chat=True)
    turns = ({"role": "assistant", "content": tool_call_text("12*34")}, {"role": "tool", "content": "408"},
             {"role": "assistant", "content": "408"})
    batch = encode_conversations(tokenizer, [SFTExample([{"role": "user", "content": "12*34="}], "408", turns=turns),
                                             SFTExample([{"role": "user", "content": "3*4="}], "10",
                                                        turns=({"role": "assistant", "content": "10"},))], 64, TOOLS)
    mask, responses = batch[Fields.RESPONSE_MASK][0].bool(), batch[Fields.RESPONSES][0]
    assert tokenizer.decode(responses[mask]) == tool_call_text("12*34") + "<eos>408<eos>"
    context = batch[Fields.ATTENTION_MASK][0, batch[Fields.PROMPTS].shape[1]:].bool()
    assert tokenizer.decode(responses[context & ~mask]) == "<|tool|>408<|assistant|>"
    assert tokenizer.decode(batch[Fields.RESPONSES][1][batch[Fields.RESPONSE_MASK][1].bool()]) == "10<eos>"
    assert list(batch[FINAL_RESPONSE]) == ["408", "10"]


def test_malformed_demonstrations_are_refused_naming_the_example():
    tokenizer = build_char_tokenizer(tool_chat=True)
    twice = SFTExample("1+1=", "2", where="demos.jsonl row 3",
                       turns=({"role": "assistant", "content": "2"}, {"role": "assistant", "content": "2"}))
    with pytest.raises(ValueError, match="demos.jsonl row 3: two assistant turns in a row"):
        encode_conversations(tokenizer, [twice], 64, TOOLS)
    long = SFTExample("1+1=", "2" * 80, turns=({"role": "assistant", "content": "2" * 80},))
    with pytest.raises(ValueError, match="SFT example 0: its turns are 81 ids, more than data.max_response_length=64"):
        encode_conversations(tokenizer, [long], 64, TOOLS)


def test_the_tool_arithmetic_demonstrations_are_imperfect():
    task = build_synthetic_task("tool_arithmetic", seed=1, sft_tool_rate=0.5)
    examples = task.sft_examples(200)
    with_tool = [e for e in examples if len(e.turns) == 3]
    assert 0.35 < len(with_tool) / len(examples) < 0.65
    for example in with_tool:
        expression = example.prompt[0]["content"].rstrip("=")
        first, second = (int(x) for x in expression.split("*"))
        assert example.turns[1]["content"] == example.turns[2]["content"] == str(first * second)
    guesses = [e for e in examples if len(e.turns) == 1]
    assert all(int(e.turns[0]["content"]) % 10 == 0 for e in guesses)


def test_trajectory_rows_pad_to_a_common_prompt_width():
    trajectories = [Trajectory(prompt_ids=[5, 6, 7]), Trajectory(prompt_ids=[8])]
    trajectories[0].add_model_turn([9, 10], [-0.5, -0.5], [0, 0])
    trajectories[1].add_model_turn([11], [-1.0], [0])
    trajectories[1].add_observation([12, 13])
    trajectories[1].reward = 0.5
    rows = Batch(non_tensors={Fields.UID: ["a", "b"]})
    batch = trajectories_to_batch(trajectories, rows, 4, pad_token_id=0, prompt_width=5)
    assert batch[Fields.PROMPTS].tolist() == [[0, 0, 5, 6, 7], [0, 0, 0, 0, 8]]
    assert batch[Fields.RESPONSE_MASK].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert batch[Fields.ATTENTION_MASK][:, 5:].tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    assert torch.equal(batch[EPISODE_REWARDS], torch.tensor([0.0, 0.5]))
    assert agent_metrics(batch)["agent/observation_tokens"] == 1.0 and len(AGENT_STATS) == 10
    with pytest.raises(ValueError, match="episode 0: its prompt .* is 3 ids, more than the 2 allowed"):
        trajectories_to_batch(trajectories, rows, 4, pad_token_id=0, prompt_width=2)


def test_per_turn_rewards_sit_on_the_last_id_of_the_turn_they_answered():
    """``reward_placement=turn_end``: a step's reward on its model turn's last id; the final answer's score (the
    reward function's) on the episode's last model id; the sum is the episode-end placement's."""
    from hybridrl.trainers.evaluation import Scoring

    trajectory = Trajectory(prompt_ids=[1])
    trajectory.add_model_turn([9, 10], [-0.1, -0.1], [0, 0])    # response ids 0-1
    trajectory.add_reward(-0.05)
    trajectory.add_observation([12, 13])                         # 2-3
    trajectory.add_model_turn([14], [-0.2], [0])                  # 4
    trajectory.add_reward(0.5)
    trajectory.add_reward(0.0)                                    # a step without reward records nothing
    assert trajectory.turn_rewards == [(1, -0.05), (4, 0.5)] and trajectory.reward == pytest.approx(0.45)
    rows = Batch(non_tensors={Fields.UID: ["a"], "data_source": ["s"], "ground_truth": ["1"], "extra_info": [{}]})
    batch = trajectories_to_batch([trajectory], rows, 6, pad_token_id=0, turn_rewards=True)
    assert batch[TURN_REWARDS][0].tolist() == pytest.approx([0.0, -0.05, 0.0, 0.0, 0.5, 0.0])
    assert TURN_REWARDS not in trajectories_to_batch([trajectory], rows, 6, pad_token_id=0)

    from hybridrl.rewards.scorer import RewardScorer

    scoring = Scoring(RewardScorer(_one_for_all, num_workers=0), tokenizer=None)
    per_turn, _ = scoring.token_level_scores(batch)
    assert per_turn[0].tolist() == pytest.approx([0.0, -0.05, 0.0, 0.0, 1.5, 0.0])
    at_end, _ = scoring.token_level_scores(trajectories_to_batch([trajectory], rows, 6, pad_token_id=0))
    assert at_end[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0, 1.45, 0.0])
    assert per_turn.sum().item() == pytest.approx(at_end.sum().item())


def _one_for_all(data_source, solution_str, ground_truth, extra_info=None):
    """A reward function that scores every final answer 1.0."""
    return 1.0


def _agent_reward_function(data_source, solution_str, ground_truth, extra_info=None):
    """The test's reward function: 1.0 when the text is the ground truth, with an ``acc`` extra."""
    right = solution_str.strip() == str(ground_truth)
    return {"score": 1.0 if right else 0.25, "acc": right}


def test_an_agents_rewards_stand_and_only_the_rows_it_left_are_scored():
    """Rows whose agent returned a reward take it as their whole reward (the reward function is not asked); rows it
    left (``None``) are scored by the reward function; metrics and extras are of the scored rows, in place."""
    from hybridrl.agents.batch import AGENT_REWARDS
    from hybridrl.rewards.scorer import RewardScorer
    from hybridrl.trainers.evaluation import Scoring

    trajectories = []
    for agent_reward, text in ((0.75, "7"), (None, "7"), (None, "8"), (-1.0, "no")):
        trajectory = Trajectory(prompt_ids=[1], final_text=text, agent_reward=agent_reward)
        trajectory.add_model_turn([9, 10], [-0.1, -0.1], [0, 0])
        trajectories.append(trajectory)
    rows = Batch(non_tensors={Fields.UID: list("abcd"), "data_source": ["s"] * 4, "ground_truth": ["7"] * 4,
                              "extra_info": [{}] * 4})
    batch = trajectories_to_batch(trajectories, rows, 3, pad_token_id=0, agent_rewards=True)
    assert torch.isnan(batch[AGENT_REWARDS][1:3]).all() and batch[AGENT_REWARDS][[0, 3]].tolist() == [0.75, -1.0]
    seen = []

    def reward_function(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return _agent_reward_function(data_source, solution_str, ground_truth, extra_info)
    with RewardScorer(reward_function, num_workers=0) as scorer:
        scoring = Scoring(scorer, tokenizer=None)
        token_scores, metrics = scoring.token_level_scores(batch)
        scores, correct, _ = scoring.judge(batch)
    assert sorted(seen) == ["7", "7", "8", "8"]  # rows 1 and 2, once for the scores and once for judge
    assert token_scores.sum(-1).tolist() == pytest.approx([0.75, 1.0, 0.25, -1.0])
    assert token_scores[:, 1].tolist() == pytest.approx([0.75, 1.0, 0.25, -1.0])  # on each row's last model id
    assert scores.tolist() == pytest.approx([0.75, 1.0, 0.25, -1.0]) and correct == [0.0, 1.0, 0.0, 0.0]
    assert metrics["reward/acc"] == pytest.approx(0.5)  # the two scored rows only
    no_agent = trajectories_to_batch([Trajectory(prompt_ids=[1], final_text="7")], rows.index([0]), 3, 0)
    assert AGENT_REWARDS not in no_agent


def test_a_dropped_agent_episode_leaves_its_groups_statistics():
    """A failed agent episode (no token in the loss) becomes a group of its own: the GRPO advantages of the others
    are those of their group without it, and its own advantage is 0."""
    from hybridrl.agents.batch import out_of_groups
    from hybridrl.algorithms.advantages import compute_grpo

    trajectories = []
    for failure in (None, "the agent raised KeyError: 'x'", None, None):
        trajectory = Trajectory(prompt_ids=[1], failure=failure)
        trajectory.add_model_turn([9, 10], [-0.1, -0.1], [0, 0])
        if failure:
            trajectory.response_mask = [0, 0]
        trajectories.append(trajectory)
    rows = Batch(non_tensors={Fields.UID: ["a", "a", "a", "b"], "data_source": ["s"] * 4,
                              "ground_truth": ["1"] * 4, "extra_info": [{}] * 4})
    batch = out_of_groups(trajectories_to_batch(trajectories, rows, 2, pad_token_id=0, agent_rewards=True))
    uids = list(batch[Fields.UID])
    assert uids[0] == uids[2] == "a" and uids[3] == "b" and uids[1].startswith("a#dropped-")
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    advantages, _ = compute_grpo(token_level_rewards=rewards, response_mask=batch[Fields.RESPONSE_MASK],
                                 index=uids)
    without, _ = compute_grpo(token_level_rewards=rewards[[0, 2]], response_mask=batch[Fields.RESPONSE_MASK][[0, 2]],
                              index=["a", "a"])
    assert torch.equal(advantages[[0, 2]], without)
    kept = trajectories_to_batch(trajectories[:1], rows.index([0]), 2, pad_token_id=0)
    assert list(out_of_groups(kept)[Fields.UID]) == ["a"]  # a batch without failures is left as it is

"""A session's record without an engine: continued calls stitched into one sequence (observations without loss),
another choice of the same prompt kept as a branch, an edited conversation counted as a split."""

from __future__ import annotations

from hybridrl.gateway.sessions import Call, SessionRecord


def call(prompt, sampled, parent=None, observation=(), tool_calls=0):
    reply = {"role": "assistant", "content": "", **({"tool_calls": [{"id": f"c{k}"} for k in range(tool_calls)]}
                                                   if tool_calls else {})}
    return Call(messages=[], reply=reply, prompt_ids=list(prompt),
                completion_ids=list(sampled), log_probs=[-0.5] * len(sampled), policy_versions=[3] * len(sampled),
                finish_reason="stop", parent=parent, observation_ids=list(observation))


def test_a_session_stitches_continued_calls_and_keeps_siblings_and_splits_apart():
    record = SessionRecord("s")
    record.add(call([1, 2], [10, 11]))                      # 0: the first prompt
    record.add(call([1, 2], [12]))                          # 1: another choice of it (n = 2): a branch
    record.add(call([1, 2, 10, 11, 7, 8], [13], parent=0, observation=[7, 8]))   # 2: continues 0
    record.add(call([5], [14]))                             # 3: an edited conversation
    assert (record.continued, record.split) == (1, 1)
    sequences = {tuple(sequence.calls): sequence for sequence in record.sequences()}
    assert set(sequences) == {(1,), (0, 2), (3,)}
    stitched = sequences[(0, 2)]
    assert stitched.prompt_ids == [1, 2] and stitched.response_ids == [10, 11, 7, 8, 13]
    assert stitched.response_mask == [1, 1, 0, 0, 1]
    assert stitched.log_probs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert stitched.policy_versions == [3, 3, -1, -1, 3]


def test_a_split_episode_keeps_its_last_calls_sequence_and_its_latest_others_up_to_the_limit():
    """``episode_trajectory``: the sequence holding the last call is the episode's row; the latest
    ``max_sequences - 1`` others ride with it (oldest first), the rest are counted as dropped; turns and tool calls
    count the whole episode; a failed episode trains none of them."""
    from hybridrl.gateway.episodes import AgentEpisode
    from hybridrl.gateway.training import episode_trajectory

    record = SessionRecord("s")
    record.add(call([1], [10], tool_calls=1))                          # 0
    record.add(call([2], [11], tool_calls=2))                          # 1: an edit
    record.add(call([1, 10, 7], [12], parent=0, observation=[7]))      # 2: continues 0, later than 1
    record.add(call([3], [13, 14]))                                    # 3: an edit, the last call
    kept = {}
    for limit in (1, 2, 3, 4):
        trajectory = episode_trajectory(AgentEpisode({}, record, reward=1.0), limit)
        assert (trajectory.prompt_ids, trajectory.response_ids, trajectory.agent_reward) == ([3], [13, 14], 1.0)
        assert trajectory.counters["split_sequences"] == 2
        # the episode's calls, whichever sequence holds them (the row's own sequence made none)
        assert (trajectory.turns, trajectory.counters["tool_calls"]) == (4, 3.0)
        assert trajectory.counters["dropped_sequences"] == max(0, 3 - limit)
        kept[limit] = [(list(other.prompt_ids), list(other.response_ids), list(other.response_mask))
                       for other in trajectory.other_sequences]
    stitched, edit = ([1], [10, 7, 12], [1, 0, 1]), ([2], [11], [1])
    assert kept == {1: [], 2: [stitched], 3: [edit, stitched], 4: [edit, stitched]}
    failed = episode_trajectory(AgentEpisode({}, record, failure="timed out"), 3)
    assert failed.other_sequences == () and sum(failed.response_mask) == 0 and failed.failure == "timed out"

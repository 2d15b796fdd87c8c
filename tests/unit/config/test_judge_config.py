"""``reward_judge``: each mistake refused at load time, naming the key (before any worker or judge starts)."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config
from hybridrl.config.errors import ConfigError

ON = ["reward_judge.enable=true"]
URL = ["reward_judge.base_url=http://127.0.0.1:8000/v1"]


@pytest.mark.parametrize("overrides, key, phrase", [
    (ON, "reward_judge.base_url", "give exactly one of reward_judge.base_url"),
    ([*ON, *URL, "reward_judge.model_path=/models/judge"], "reward_judge.base_url", "not both"),
    ([*ON, "reward_judge.base_url=localhost:8000"], "reward_judge.base_url", "must be an http(s) URL"),
    ([*ON, *URL, "reward_judge.template='Is this right? {prompt}'"], "reward_judge.template",
     "has no {response} placeholder"),
    ([*ON, *URL, "reward_judge.api=responses"], "reward_judge.api", "expected one of chat, completions"),
    ([*ON, *URL, "reward_judge.api=completions", "reward_judge.system_prompt=strict"],
     "reward_judge.system_prompt", "only with api=chat"),
    ([*ON, *URL, "reward_judge.score_regex='Score: ((\\d)'"], "reward_judge.score_regex", "not a regular expression"),
    ([*ON, *URL, "reward_judge.score_regex='(a)(b)'"], "reward_judge.score_regex", "has 2 groups"),
    ([*ON, *URL, "reward_judge.score_fn=judging"], "reward_judge.score_fn", "'path/to/file.py:function_name'"),
    ([*ON, *URL, "reward_judge.score_range=[10,0]"], "reward_judge.score_range", "must be [low, high]"),
    ([*ON, *URL, "reward_judge.timeout_s=0"], "reward_judge.timeout_s", "must be a positive number"),
    ([*ON, *URL, "reward_judge.max_retries=-1"], "reward_judge.max_retries", "must be >= 0"),
    ([*ON, *URL, "reward_fusion.normalize=[judges]"], "reward_fusion.normalize", "rule, rm, judge"),
])
def test_judge_mistakes_are_refused_naming_the_key(overrides, key, phrase):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides, check_paths=False)
    assert key in str(caught.value) and phrase in str(caught.value), str(caught.value)


def test_a_served_judge_needs_a_model_directory_and_a_score_function_file(tmp_path):
    from hybridrl.utils.tiny_model import save_tiny_model

    policy = save_tiny_model(tmp_path / "policy")
    base = [f"model.path={policy}", "rollout=hf", "trainer.device=cpu", *ON]
    config = load_config([*base, f"reward_judge.model_path={policy}", "reward_fusion.normalize=[judge]"])
    assert config.reward_judge.model_path == str(policy) and config.reward_fusion.judge_weight == 1.0
    for overrides, key, phrase in [
            ([f"reward_judge.model_path={tmp_path / 'none'}"], "reward_judge.model_path", "does not exist"),
            ([*URL, "reward_judge.api_key_env=HYBRIDRL_TEST_UNSET_KEY"], "reward_judge.api_key_env", "is not set"),
            ([*URL, f"reward_judge.score_fn={tmp_path / 'none.py'}:score"], "reward_judge.score_fn", "does not exist")]:
        with pytest.raises(ConfigError) as caught:
            load_config([*base, *overrides])
        assert key in str(caught.value) and phrase in str(caught.value), str(caught.value)


def test_judge_keys_are_inert_while_the_judge_is_off():
    config = load_config(["reward_judge.template=no placeholder"], check_paths=False)
    assert not config.reward_judge.enable


def test_a_template_with_braces_given_unquoted_is_named_with_the_quoting_that_works():
    with pytest.raises(ConfigError) as caught:
        load_config(["reward_judge.template={prompt}{response}"], check_paths=False)
    message = str(caught.value)
    assert "reward_judge.template" in message and "quote the value" in message
    hint = message.split("e.g. ")[1].strip().strip("'")
    assert load_config([hint], check_paths=False).reward_judge.template == "{prompt}{response}"

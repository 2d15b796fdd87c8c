"""The LLM-judge reward client against a real HTTP server whose replies the test scripts.

The server is a stand-in for the judge *model* (what it replies is the test's choice); the component under test is
the client: rendering, the request it sends, parsing, fallbacks and their counts, timeouts, retries, concurrency.
"""

from __future__ import annotations

import pytest
import torch

from hybridrl.rewards.judge import (JudgeClient, JudgeError, JudgeQuery, load_score_fn, regex_parser,
                                   render_template)
from scripted_judge import scripted  # noqa: F401  (a fixture)


def length_judge(text: str) -> str:
    """Score = the response's length, read from the rendered prompt ``...R=<response>|``."""
    response = text.split("R=", 1)[1].split("|", 1)[0]
    return f"I think... Score: {len(response)}"


def test_rendering_substitutes_the_three_placeholders_once_and_nothing_else():
    query = JudgeQuery("2+2=", "4 {prompt}", "4")
    assert render_template("Q:{prompt} A:{response} ref={ground_truth} {other} {{x}}", query) == \
        "Q:2+2= A:4 {prompt} ref=4 {other} {{x}}"
    assert render_template("{response}{ground_truth}", JudgeQuery("p", "r")) == "r"


def test_regex_parser_reads_group_one_or_the_whole_match():
    assert regex_parser(r"Score:\s*(-?\d+(?:\.\d+)?)")("a Score: -2.5 b Score: 3") == -2.5
    assert regex_parser(r"\d+")("x 42 y") == 42.0
    assert regex_parser(r"Score: (\w+)")("Score: ten") is None
    assert regex_parser(r"Score: (\d)")("no score") is None


def test_scores_come_from_the_replies_over_http_with_the_rendered_chat_request(scripted):
    judge = scripted(length_judge)
    queries = [JudgeQuery("p", "a" * size, "gt") for size in (0, 1, 5, 12)]
    with JudgeClient(judge.base_url, "P={prompt} R={response}| G={ground_truth}", regex_parser(r"Score: (\d+)"),
                     system_prompt="be strict", max_tokens=7, api_key="secret") as client:
        assert client.model == "served-judge"  # from GET /models
        batch = client.score(queries)
    assert torch.equal(batch.scores, torch.tensor([0.0, 1.0, 5.0, 12.0]))
    assert batch.statuses == ["ok"] * 4 and batch.metrics() == {
        "reward/judge/num_timeout": 0.0, "reward/judge/num_error": 0.0, "reward/judge/num_parse_failure": 0.0}
    path, body, auth = judge.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer secret"
    assert body["model"] == "served-judge" and body["max_tokens"] == 7 and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": "be strict"}
    assert sorted(request[1]["messages"][1]["content"] for request in judge.requests) == sorted(
        f"P=p R={'a' * size}| G=gt" for size in (0, 1, 5, 12))


def test_completions_api_sends_the_raw_prompt(scripted):
    judge = scripted(length_judge)
    with JudgeClient(judge.base_url, "R={response}|", regex_parser(r"Score: (\d+)"), api="completions",
                     model="named") as client:
        assert client.score([JudgeQuery("p", "abc")]).scores.tolist() == [3.0]
    path, body, _ = judge.requests[0]
    assert path == "/v1/completions" and body["prompt"] == "R=abc|" and body["model"] == "named"


def test_each_failure_scores_the_fallback_and_is_counted_by_its_cause(scripted, caplog):
    def script(text: str):
        response = text.split("R=", 1)[1]
        return {"slow": ("sleep", 3.0, "Score: 9"), "http": 400, "garbage": "I refuse to score this",
                "range": "Score: 99"}.get(response, "Score: 7")
    judge = scripted(script)
    with JudgeClient(judge.base_url, "R={response}", regex_parser(r"Score: (\d+)"), model="m", fallback_score=-1.0,
                     score_range=[0, 10], timeout_s=1.0, max_retries=0) as client:
        batch = client.score([JudgeQuery("p", text) for text in ("fine", "slow", "http", "garbage", "range")])
    assert batch.scores.tolist() == [7.0, -1.0, -1.0, -1.0, -1.0]
    assert batch.statuses == ["ok", "timeout", "error", "parse_failure", "parse_failure"]
    assert batch.metrics()["reward/judge/num_parse_failure"] == 2.0 and batch.metrics()["reward/judge/num_timeout"] == 1
    assert "HTTP 400" in batch.problems[1] and "I refuse" in batch.problems[2] and "score_range" in batch.problems[3]
    assert "4 of 5 judgements failed" in caplog.text


def test_a_busy_judge_is_retried_and_requests_run_concurrently(scripted):
    attempts: dict[str, int] = {}

    def script(text: str):
        attempts[text] = attempts.get(text, 0) + 1
        return 503 if attempts[text] == 1 else ("sleep", 0.3, "Score: 1")
    judge = scripted(script)
    with JudgeClient(judge.base_url, "{response}", regex_parser(r"Score: (\d)"), model="m", max_retries=1,
                     max_concurrency=8) as client:
        batch = client.score([JudgeQuery("p", str(index)) for index in range(8)])
    assert batch.scores.tolist() == [1.0] * 8 and set(attempts.values()) == {2}
    assert judge.most_in_flight > 1


def test_a_batch_in_which_every_judgement_failed_stops_the_run(scripted):
    judge = scripted(lambda _text: "no number here")
    with JudgeClient(judge.base_url, "{response}", regex_parser(r"Score: (\d)"), model="m") as client:
        with pytest.raises(JudgeError, match=r"every one of the batch's 2 judgements failed.*no score in the reply"):
            client.score([JudgeQuery("p", "a"), JudgeQuery("p", "b")])


def test_a_judge_that_is_not_there_is_named(scripted):
    with pytest.raises(ValueError, match=r"does not answer GET /models.*reward_judge.model"):
        JudgeClient("http://127.0.0.1:9/v1", "{response}", regex_parser("x"), timeout_s=2.0)
    with pytest.raises(ValueError, match=r"reward_judge.template has no \{response\}"):
        JudgeClient("http://127.0.0.1:9/v1", "{prompt}", regex_parser("x"), model="m")


def test_a_score_function_from_a_file_reads_the_reply(scripted, tmp_path):
    (tmp_path / "judging.py").write_text("def score(reply):\n    if 'odd' in reply:\n        return 'n/a'\n"
                                         "    return 1.0 if 'yes' in reply.lower() else None\n")
    parse = load_score_fn(f"{tmp_path / 'judging.py'}:score")
    judge = scripted(lambda text: "Yes." if "good" in text else "odd" if "odd" in text else "Hmm")
    with JudgeClient(judge.base_url, "{response}", parse, model="m", fallback_score=0.25) as client:
        batch = client.score([JudgeQuery("p", "good"), JudgeQuery("p", "bad"), JudgeQuery("p", "odd")])
    assert batch.scores.tolist() == [1.0, 0.25, 0.25] and batch.statuses == ["ok", "parse_failure", "parse_failure"]
    assert "the parser raised ValueError" in batch.problems[1]  # a return that is not a number: a parse failure
    with pytest.raises(ValueError, match="reward_judge.score_fn.*no function 'other'"):
        load_score_fn(f"{tmp_path / 'judging.py'}:other")
    with pytest.raises(ValueError, match="reward_judge.score_fn.*'path/to/file.py:function_name'"):
        load_score_fn("judging.py")

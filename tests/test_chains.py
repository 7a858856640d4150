"""The demo's task: chain arithmetic prompts, their rule reward, the "learns" corpus, and the demo's step table."""

import random

import pytest

from infsample_lab.tasks import chains, compute_score
from infsample_lab.tasks.chains import GUESS_RIGHT, chain_answer, guess_or_count


@pytest.mark.parametrize("prompt, answer", [("add 41 and 7", 48), ("what is 5 times 3", 15), ("count to 9", 9)])
def test_chain_answer(prompt, answer):
    assert chain_answer(prompt) == answer


def test_chain_answer_refuses_other_prompts():
    with pytest.raises(ValueError, match="not a chain prompt"):
        chain_answer("tell a story about moon")


def test_the_learns_corpus_counts_right_and_guesses_mostly_wrong():
    rng = random.Random(0)
    counted = [guess_or_count(rng, "count") for _ in range(300)]
    guessed = [guess_or_count(rng, "guess") for _ in range(2000)]
    assert all(chains.compute_score(chains.DATA_SOURCE, a, chain_answer(p)) == 1.0 for p, a in counted)
    right = sum(chains.compute_score(chains.DATA_SOURCE, a, chain_answer(p)) for p, a in guessed) / len(guessed)
    assert abs(right - GUESS_RIGHT) < 0.03
    assert {a.split()[0] for _, a in counted} == {"count"} and {a.split()[0] for _, a in guessed} == {"answer"}


@pytest.mark.parametrize("response, score", [("count : 42 43 . answer : 43 .", 1.0), ("answer : 43 .", 1.0),
                                             ("answer : 44 .", 0.0), ("count : 42 43 .", 0.0), ("", 0.0),
                                             ("answer : 43 . and more", 0.0)])
def test_the_reward_checks_the_final_answer(response, score):
    assert compute_score(data_source=chains.DATA_SOURCE, solution_str=response, ground_truth="43") == score


def test_rows_carry_the_right_answer_as_ground_truth():
    rows = chains.make_rows(20, seed=3, split="train")
    assert len(rows) == 20 and {r["data_source"] for r in rows} == {chains.DATA_SOURCE}
    for r in rows:
        assert r["reward_model"]["ground_truth"] == str(chain_answer(r["prompt"][0]["content"]))
    assert rows == chains.make_rows(20, seed=3, split="train") != chains.make_rows(20, seed=4, split="train")


def test_the_demo_table_reads_verls_step_lines():
    from infsample_lab.bench.in_verl import parse_step_lines
    from infsample_lab.demo import step_rows

    line = ("(TaskRunnerV1 pid=1) step:2 - critic/score/mean:np.float64(0.5) - response_length/mean:9.5 - "
            "infsample/wall_s:1.25 - infsample/decode_steps:110 - infsample/lower_bound_steps:100 - "
            "infsample/peak_kv_bytes:2048")
    assert step_rows(parse_step_lines(line)) == [
        {"step": 2, "reward": 0.5, "response_len": 9.5, "gen_s": 1.25, "decode_steps": 110, "lower_bound": 100,
         "steps_vs_bound": 1.1, "peak_kv_kib": 2.0}]

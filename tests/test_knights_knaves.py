"""Knights and knaves: unique solutions (checked by an independent solver), the rule reward on every generated
puzzle, garbage never crashes, seeded determinism, and verl's parquet rows."""

import importlib.util
import itertools
import json
import random
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infsample_lab.tasks import compute_score as dispatch_score
from infsample_lab.tasks import knights_knaves as kk

ROOT = Path(__file__).resolve().parents[1]
VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}


def load_script(rel):
    """Import a file by path, as verl's load_extern_object does for reward.custom_reward_function.path."""
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(f"_ex_{path.stem}_{abs(hash(rel))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# an independent solver: plain Python, itertools, no numpy
def truth(node, roles):
    op = node[0]
    if op == "lit":
        return roles[node[1]] == node[2]
    if op == "not":
        return not truth(node[1], roles)
    if op == "and":
        return all(truth(c, roles) for c in node[1])
    if op == "or":
        return any(truth(c, roles) for c in node[1])
    if op == "imp":
        return (not truth(node[1], roles)) or truth(node[2], roles)
    if op == "iff":
        return truth(node[1], roles) == truth(node[2], roles)
    raise AssertionError(op)


def brute_force(statements):
    n = len(statements)
    return [roles for roles in itertools.product((False, True), repeat=n)
            if all(roles[i] == truth(s, roles) for i, s in enumerate(statements))]


@pytest.fixture(scope="module")
def puzzles():
    ps = kk.generate_puzzles(350, 2, 8, seed=11)  # 50 per difficulty
    assert len(ps) == 350
    return ps


def score(puzzle, text, **kw):
    return kk.compute_score(data_source=kk.DATA_SOURCE, solution_str=text, ground_truth=puzzle.ground_truth(),
                            extra_info={"split": "test", "index": 0}, **kw)


def answer_lines(puzzle, roles):
    return kk.format_answer(puzzle.names, roles)


def flip(role):
    return kk.KNAVE if role == kk.KNIGHT else kk.KNIGHT


def test_every_puzzle_has_exactly_one_solution(puzzles):
    assert {p.n for p in puzzles} == set(range(2, 9))
    for p in puzzles:
        # the statements survive JSON (what the parquet's extra_info carries) and solve the same way
        statements = json.loads(p.statements_json())
        sols = brute_force(statements)
        assert sols == [p.solution], p.question()
        assert kk.solve(statements) == [p.solution]
        assert len(set(p.names)) == p.n


def test_reward_on_every_generated_puzzle(puzzles):
    for p in puzzles:
        roles = p.roles
        reasoning = f"Let me think. Suppose {p.names[0]} is a {flip(roles[0])}. That leads to a contradiction.\n"
        assert score(p, p.answer()) == 1.0
        assert score(p, reasoning + p.answer()) == 1.0
        # lines in another order: the numbering and order are not checked
        shuffled = list(zip(p.names, roles))[::-1]
        assert score(p, "CONCLUSION:\n" + "\n".join(f"{n} is a {r}." for n, r in shuffled)) == 1.0
        for i in range(p.n):
            wrong = list(roles)
            wrong[i] = flip(wrong[i])
            assert score(p, answer_lines(p, wrong)) == pytest.approx(0.1)  # well formed, wrong: format score only
            assert score(p, answer_lines(p, wrong), format_score=0.0) == 0.0
            missing = [line for line in p.answer().splitlines() if p.names[i] not in line]
            assert score(p, "\n".join(missing)) == 0.0
            both = p.answer() + f"\n{p.names[i]} is a {flip(roles[i])}"  # hedging: both roles for one person
            assert score(p, both) == 0.0
        # the right roles in the reasoning but no CONCLUSION marker
        assert score(p, p.answer().replace("CONCLUSION:", "So:")) == 0.0
        # a correct conclusion followed by a second, wrong one: only the last counts
        all_flipped = answer_lines(p, [flip(r) for r in roles])
        assert score(p, p.answer() + "\n" + all_flipped) == pytest.approx(0.1)  # well formed, wrong


# puzzles solved by hand: (names, statements, roles)
KNOWN = [
    # Mia: "Ava and I are both knaves." Ava: "Mia is a knave." If Mia were a knight, her statement would make her a
    # knave; so she is a knave, her statement is false, so Ava is a knight, and Ava's statement is true.
    (("Mia", "Ava"), (["and", [["lit", 1, False], ["lit", 0, False]]], ["lit", 0, False]), ("knave", "knight")),
    # Liam: "Noah is a knight if and only if I am a knave." Noah: "Liam is a knight." Whatever Liam is, his statement
    # forces Noah to be a knave (a knight Liam: "Noah is a knight" is false; a knave Liam: the iff must be false with
    # "I am a knave" true); a knave Noah lies, so Liam is a knave too.
    (("Liam", "Noah"), (["iff", ["lit", 1, True], ["lit", 0, False]], ["lit", 0, True]), ("knave", "knave")),
    # Zoey: "Oliver is a knave." Oliver: "Zoey and Ella are both knaves." Ella: "Zoey is a knight or I am a knave."
    # A knave Ella would be telling the truth; so Ella is a knight, then Zoey is a knight, then Oliver is a knave
    # (his statement is false: Zoey is a knight).
    (("Zoey", "Oliver", "Ella"),
     (["lit", 1, False], ["and", [["lit", 0, False], ["lit", 2, False]]],
      ["or", [["lit", 0, True], ["lit", 2, False]]]),
     ("knight", "knave", "knight")),
]


@pytest.mark.parametrize("names, statements, roles", KNOWN, ids=[k[0][0] for k in KNOWN])
def test_reward_on_puzzles_with_known_answers(names, statements, roles):
    """The reward against answers worked out by hand: the right roles score ``score``, every other assignment
    ``format_score`` (less), and malformed conclusions 0.0."""
    solution = tuple(r == "knight" for r in roles)
    assert brute_force(statements) == [solution] and kk.solve(statements) == [solution]  # the hand solution, unique
    p = kk.Puzzle(names=names, statements=statements, solution=solution)
    assert json.loads(p.ground_truth()) == dict(zip(names, roles))

    def typed(assignment):
        return "CONCLUSION:\n" + "\n".join(f"({i + 1}) {n} is a {r}" for i, (n, r) in enumerate(zip(names, assignment)))

    assert score(p, "I reason it through.\n" + typed(roles)) == 1.0
    assert score(p, typed(roles), score=2.0) == 2.0
    for assignment in itertools.product(("knight", "knave"), repeat=len(names)):
        if assignment != roles:
            assert score(p, typed(assignment)) == pytest.approx(0.1), assignment
            assert score(p, typed(assignment), format_score=0.0) == 0.0
    malformed = [
        typed(roles).replace("CONCLUSION:", "Answer:"),  # no marker
        typed(roles).rsplit("\n", 1)[0],  # the last inhabitant missing
        typed(roles) + f"\n{names[0]} is a {'knave' if roles[0] == 'knight' else 'knight'}",  # both roles for one
        typed(roles).replace(f"{names[-1]} is a {roles[-1]}", f"{names[-1]} is {roles[-1]}"),  # no article
        typed(roles) + "\nCONCLUSION: I am not sure.",  # a later, empty conclusion
    ]
    for text in malformed:
        assert score(p, text) == 0.0, text


def test_parsing_details():
    p = kk.Puzzle(names=("Stella", "Ella"), statements=(["lit", 1, True], ["lit", 0, True]), solution=(True, True))
    # "Ella" must not match inside "Stella"
    assert score(p, "CONCLUSION:\n(1) Stella is a knight") == 0.0
    assert score(p, "CONCLUSION:\n(1) Stella is a knight\n(2) Ella is a knight") == 1.0
    assert score(p, "**CONCLUSION:**\n1. stella is a Knight\n2. ELLA is a knight") == 1.0
    assert score(p, "CONCLUSION:\n(1) Stella is not a knight\n(2) Ella is a knight") == 0.0
    assert score(p, "CONCLUSION:\n(1) Stella is a knight\n(2) Ella is a knightly person") == 0.0
    # the ground truth may also come as a dict
    assert kk.compute_score("knights_knaves", p.answer(), {"Stella": "knight", "Ella": "knight"}) == 1.0
    with pytest.raises(ValueError):
        kk.compute_score("knights_knaves", p.answer(), '{"Stella": "wizard"}')


GARBAGE = [None, "", " ", "CONCLUSION:", "CONCLUSION:" * 1000, "knight knave " * 5000, "\x00\xff\ud800?",
           "(1) is a knight\n(2) is a knave", "#### 42", "<answer></answer>", b"\xff\xfe CONCLUSION:", 12345,
           ["CONCLUSION:"], {"a": 1}, float("nan"), "CONCLUSION: " + "(" * 10000, "is a " * 20000]


def test_garbage_never_crashes(puzzles):
    for p in puzzles[::25]:
        for g in GARBAGE:
            assert score(p, g) == 0.0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list("CONLUSI: \n()12abknightve") + ["Zoey", "Oliver", " is a ", "CONCLUSION:"]),
                max_size=80).map("".join))
def test_random_text_never_crashes_and_the_last_conclusion_decides(text):
    """Any text: no crash, 0.0 without a marker, and a conclusion appended after it decides the score."""
    p = kk.Puzzle(names=("Zoey", "Oliver"), statements=(["lit", 1, True], ["lit", 0, True]), solution=(True, True))
    assert score(p, text) in (0.0, 0.1, 1.0)
    if "conclusion" not in text.lower():
        assert score(p, text) == 0.0
    assert score(p, text + "\nCONCLUSION:\n(1) Zoey is a knight\n(2) Oliver is a knight") == 1.0
    assert score(p, text + "\nCONCLUSION:\n(1) Zoey is a knight\n(2) Oliver is a knave") == pytest.approx(0.1)
    assert score(p, text + "\nCONCLUSION:\n(1) Zoey is a knight") == 0.0


def test_verl_calling_convention():
    """verl 0.9.1 calls compute_score(data_source=, solution_str=, ground_truth=, extra_info=[, **extra]); the
    custom function is wrapped by get_custom_reward_fn as partial(_call_with_kwargs, fn, reward_kwargs)."""
    spec = importlib.util.find_spec("verl")  # locates the installed package without importing it (verl is slow)
    src = (Path(spec.submodule_search_locations[0]) / "experimental/reward_loop/reward_manager/naive.py").read_text()
    call = re.search(r"self\.compute_score\((.*?)\)", src, re.S).group(1)
    for kw in ("data_source=", "solution_str=", "ground_truth=", "extra_info="):
        assert kw in call

    def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):  # verl.trainer.ppo.reward._call_with_kwargs
        return raw_fn(*args, **{**kwargs, **extra_kwargs})

    reward = load_script("examples/logic_puzzles/reward.py")
    p = kk.generate_puzzles(1, 5, 5, seed=3)[0]
    row = kk.to_verl_rows([p], "test")[0]
    for reward_kwargs, wrong_score in (({}, 0.1), ({"format_score": 0.0}, 0.0)):
        fn = partial(_call_with_kwargs, reward.compute_score, reward_kwargs)
        kwargs = dict(data_source=row["data_source"], ground_truth=row["reward_model"]["ground_truth"],
                      extra_info={**row["extra_info"], "num_turns": None, "rollout_reward_scores": {}},
                      reward_router_address=None, reward_model_tokenizer=None)
        assert fn(solution_str="ok\n" + p.answer(), **kwargs) == 1.0
        wrong = kk.format_answer(p.names, [flip(r) for r in p.roles])
        assert fn(solution_str=wrong, **kwargs) == wrong_score
        assert fn(solution_str="no idea", **kwargs) == 0.0


def test_dispatch_hands_other_sources_to_verl_default(monkeypatch):
    """Other data sources go to verl's default_compute_score (faked here: importing verl takes ~15 s)."""
    import types

    calls = []
    fake = types.ModuleType("verl.utils.reward_score")
    fake.default_compute_score = lambda *a, **k: calls.append((a, k)) or 0.5
    for name in ("verl", "verl.utils"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "verl.utils.reward_score", fake)
    assert dispatch_score(data_source="openai/gsm8k", solution_str="#### 3", ground_truth="3", extra_info={}) == 0.5
    assert calls == [(("openai/gsm8k", "#### 3", "3", {}), {})]


def test_determinism_and_splits():
    a = kk.generate_puzzles(40, 2, 6, seed=5)
    b = kk.generate_puzzles(40, 2, 6, seed=5)
    c = kk.generate_puzzles(40, 2, 6, seed=6)
    assert [p.prompt() for p in a] == [p.prompt() for p in b]
    assert [p.ground_truth() for p in a] == [p.ground_truth() for p in b]
    assert [p.prompt() for p in a] != [p.prompt() for p in c]
    assert [p.n for p in a] == [2 + i % 5 for i in range(40)]
    train, test = kk.make_splits(60, 20, 2, 3, seed=0)
    assert not {p.question() for p in train} & {p.question() for p in test}
    assert len({p.question() for p in train}) == 60
    assert all(2 <= p.n <= 3 for p in train + test)
    with pytest.raises(ValueError):
        kk.generate_puzzles(1, 5, 4)


def test_prompt_text(puzzles):
    for p in puzzles[:20]:
        text = p.prompt()
        assert all(name in text for name in p.names)
        assert text.count(" says, ") == p.n
        assert "CONCLUSION:" in text and "knight" in text and "knave" in text


def test_prepare_data_parquet_round_trip(tmp_path):
    prep = load_script("examples/logic_puzzles/prepare_data.py")
    args = ["--out-dir", str(tmp_path / "a"), "--train", "30", "--test", "10", "--min-people", "3",
            "--max-people", "5", "--seed", "7"]
    assert prep.main(args) == 0
    train = pd.read_parquet(tmp_path / "a" / "train.parquet")
    test = pd.read_parquet(tmp_path / "a" / "test.parquet")
    assert len(train) == 30 and len(test) == 10
    for df, split in ((train, "train"), (test, "test")):
        assert set(df.columns) == VERL_COLUMNS
        for idx, row in enumerate(df.itertuples()):
            assert row.data_source == "knights_knaves" and row.ability == "logic"
            assert len(row.prompt) == 1 and row.prompt[0]["role"] == "user"
            assert "CONCLUSION:" in row.prompt[0]["content"]
            assert row.reward_model["style"] == "rule"
            gt = row.reward_model["ground_truth"]
            assert isinstance(gt, str) and len(json.loads(gt)) == row.extra_info["n_people"]
            assert 3 <= row.extra_info["n_people"] <= 5
            assert row.extra_info["split"] == split and row.extra_info["index"] == idx
            assert brute_force(json.loads(row.extra_info["statements"])) != []
            # what verl passes through: the parquet's ground truth and the stored answer score 1.0
            assert kk.compute_score(row.data_source, row.extra_info["answer"], gt, dict(row.extra_info)) == 1.0
    assert not set(train.extra_info.map(lambda e: e["question"])) & set(test.extra_info.map(lambda e: e["question"]))
    # same seed, same files
    assert prep.main([*args[:1], str(tmp_path / "b"), *args[2:]]) == 0
    pd.testing.assert_frame_equal(train, pd.read_parquet(tmp_path / "b" / "train.parquet"))
    with pytest.raises(SystemExit):
        prep.main(["--out-dir", str(tmp_path), "--min-people", "6", "--max-people", "3"])


def test_tasks_import_without_torch_or_verl():
    code = ("import sys, infsample_lab.tasks; "
            "bad = [m for m in ('torch', 'ray', 'verl', 'datasets') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_generator_uses_random_not_global_state():
    random.seed(0)
    a = kk.generate_puzzles(5, 2, 4, seed=1)
    random.seed(99)
    b = kk.generate_puzzles(5, 2, 4, seed=1)
    assert [p.prompt() for p in a] == [p.prompt() for p in b]

"""GSM8K data: verl's row format, the generated offline sample is arithmetically right and scored 1.0 by verl's own
gsm8k reward, and an unreachable Hub is one clear error naming --offline-sample."""

import ast
import importlib.util
import json
import operator
import re
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from infsample_lab.tasks import gsm8k

ROOT = Path(__file__).resolve().parents[1]
VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def load_file(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verl_gsm8k():
    """The installed verl's verl/utils/reward_score/gsm8k.py, loaded by path: the very file verl's
    default_compute_score uses for openai/gsm8k, without running verl/__init__ (which imports torch and Ray, ~15 s)."""
    spec = importlib.util.find_spec("verl")
    path = Path(spec.submodule_search_locations[0]) / "utils" / "reward_score" / "gsm8k.py"
    return load_file(path, "_verl_reward_score_gsm8k")


@pytest.fixture(scope="module")
def preprocess():
    return load_file(ROOT / "examples" / "gsm8k" / "preprocess.py", "_ex_gsm8k_preprocess")


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calc(expr):
    """Evaluate + - * / on integers (GSM8K calculator annotations), nothing else."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(ast.dump(node))
    return ev(ast.parse(expr, mode="eval"))


# independent recomputation of each template's answer from its parameters
RECOMPUTE = {
    "packs": lambda p: p["a"] * p["b"] - p["c"],
    "savings": lambda p: (p["rate"] * p["hours"] - p["spend"]) * p["weeks"],
    "boxes": lambda p: p["total"] // p["boxes"] + p["extra"],
    "trip": lambda p: p["v1"] * p["t1"] + p["v2"] * p["t2"],
    "discount": lambda p: p["price"] - p["price"] * p["pct"] // 100,
    "ages": lambda p: p["k"] * p["b_age"] + p["years"],
    "class": lambda p: p["students"] - p["students"] // p["f"] - p["basketball"],
}


def test_offline_sample_is_arithmetically_right():
    sample = gsm8k.generate_sample(210, seed=4)
    assert {ex["template"] for ex in sample} == set(RECOMPUTE) == set(gsm8k.TEMPLATES)
    for ex in sample:
        params = json.loads(ex["params"])
        final = int(gsm8k.extract_solution(ex["answer"]))
        assert final == RECOMPUTE[ex["template"]](params), ex
        assert final >= 0
        for value in params.values():  # every given number is in the question
            assert re.search(rf"(?<!\d){value}(?!\d)", ex["question"]), (value, ex["question"])
        steps = re.findall(r"<<([^=>]+)=([^>]+)>>(\S+)", ex["answer"])
        assert steps
        for expr, result, shown in steps:
            exact = calc(expr)
            assert exact == int(result) == int(shown), (expr, result)
        assert int(steps[-1][1]) == final
        assert ex["answer"].rstrip().endswith(f"#### {final}")


def test_rows_match_verl_format_and_verl_scores_the_reference(verl_gsm8k):
    train, test = gsm8k.sample_splits(70, 21, seed=0)
    for split, examples in (("train", train), ("test", test)):
        for idx, row in enumerate(gsm8k.to_verl_rows(examples, split)):
            ex = examples[idx]
            assert set(row) == VERL_COLUMNS
            assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
            assert row["prompt"] == [{"role": "user", "content": ex["question"] + " " + INSTRUCTION}]
            gt = row["reward_model"]["ground_truth"]
            assert row["reward_model"] == {"style": "rule", "ground_truth": gt}
            assert gt == verl_gsm8k.extract_solution(ex["answer"])  # verl's own extraction agrees
            info = row["extra_info"]
            assert (info["split"], info["index"], info["answer"], info["question"]) == (split, idx, ex["answer"],
                                                                                        ex["question"])
            # verl's reward: the reference worked solution scores 1.0, a wrong final answer 0, no answer 0
            assert verl_gsm8k.compute_score(ex["answer"], gt) == 1.0
            assert verl_gsm8k.compute_score("Some reasoning.\n#### " + gt, gt) == 1.0
            wrong = ex["answer"].rsplit("####", 1)[0] + f"#### {int(gt) + 1}"
            assert verl_gsm8k.compute_score(wrong, gt) == 0
            assert verl_gsm8k.compute_score("I think the answer is " + gt, gt) == 0
    assert not {e["question"] for e in train} & {e["question"] for e in test}


def test_extract_solution_like_verl():
    assert gsm8k.extract_solution("so 3+4=7\n#### 1,234") == "1234"
    assert gsm8k.extract_solution("#### -5") == "-5"
    with pytest.raises(ValueError):
        gsm8k.extract_solution("no final answer")


def test_offline_sample_cli_parquet_round_trip(preprocess, verl_gsm8k, tmp_path, monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("--offline-sample must not load the dataset")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=no_network))
    assert preprocess.main(["--local_save_dir", str(tmp_path / "a"), "--offline-sample", "12", "--seed", "3"]) == 0
    assert preprocess.main(["--out-dir", str(tmp_path / "b"), "--offline-sample", "12", "--seed", "3"]) == 0
    for split in ("train", "test"):
        df = pd.read_parquet(tmp_path / "a" / f"{split}.parquet")
        pd.testing.assert_frame_equal(df, pd.read_parquet(tmp_path / "b" / f"{split}.parquet"))  # deterministic
        assert len(df) == 12 and set(df.columns) == VERL_COLUMNS
        for row in df.itertuples():
            assert row.data_source == "openai/gsm8k" and row.prompt[0]["content"].endswith(INSTRUCTION)
            assert row.extra_info["split"] == split
            assert verl_gsm8k.compute_score(row.extra_info["answer"], row.reward_model["ground_truth"]) == 1.0
    other = gsm8k.generate_sample(12, seed="other")
    assert [e["question"] for e in other] != [e["question"] for e in gsm8k.generate_sample(12, seed=3)]


def test_hub_unreachable_is_one_clear_error(preprocess, tmp_path, monkeypatch, capsys):
    def unreachable(*a, **k):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(gsm8k.GSM8KUnavailable, match="--offline-sample"):
        gsm8k.load_gsm8k()
    capsys.readouterr()
    assert preprocess.main(["--local_save_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--offline-sample N" in err and "openai/gsm8k" in err and "ConnectionError" in err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_hub_path_builds_verl_rows(preprocess, tmp_path, monkeypatch):
    """With the Hub reachable (faked: no network here) the real dataset's splits become verl rows."""
    calls = []
    fake = {"train": gsm8k.generate_sample(3, seed=1), "test": gsm8k.generate_sample(2, seed=2)}
    for split in fake.values():
        for ex in split:  # the Hub's rows have only these two columns
            del ex["template"], ex["params"]

    def load_dataset(path, name):
        calls.append((path, name))
        return fake

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert preprocess.main(["--local_save_dir", str(tmp_path)]) == 0
    assert calls == [("openai/gsm8k", "main")]
    df = pd.read_parquet(tmp_path / "train.parquet")
    assert len(df) == 3 and set(df.extra_info[0]) == {"split", "index", "answer", "question"}
    assert len(pd.read_parquet(tmp_path / "test.parquet")) == 2

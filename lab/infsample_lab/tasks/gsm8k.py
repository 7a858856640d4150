"""GSM8K as verl data: the rows of verl's examples/data_preprocess/gsm8k.py, from the Hub or from a generated sample.

* :func:`load_gsm8k` loads ``openai/gsm8k`` (config ``main``) with ``datasets.load_dataset``, like verl's script.
  When that fails (no network, offline mode, ...) it raises :class:`GSM8KUnavailable`, whose message names the
  ``--offline-sample`` option of ``examples/gsm8k/preprocess.py``.
* :func:`generate_sample` makes GSM8K-format problems itself: templated grade-school arithmetic word problems whose
  worked solutions use GSM8K's calculator annotations (``<<48/2=24>>``) and end in ``#### <answer>``. No GSM8K data
  is copied.
* :func:`to_verl_rows` builds verl's rows: data_source ``openai/gsm8k``, the question plus verl's instruction suffix,
  ability ``math``, ``reward_model = {"style": "rule", "ground_truth": "<answer>"}``, extra_info
  ``{split, index, answer, question}`` (generated rows add ``template`` and ``params``, a JSON string).

The reward is verl's own ``verl.utils.reward_score.gsm8k.compute_score(solution_str, ground_truth)``, which verl's
``default_compute_score`` already selects for data_source ``openai/gsm8k``: 1.0 when the last ``#### N`` of the
response equals the ground truth, else 0.0. No custom reward function is needed.

Pure Python at import (``datasets`` only inside :func:`load_gsm8k`).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Callable, Iterable, Mapping

DATA_SOURCE = "openai/gsm8k"
HUB_CONFIG = "main"
ABILITY = "math"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


class GSM8KUnavailable(RuntimeError):
    """openai/gsm8k could not be loaded (typically: the Hugging Face Hub is unreachable)."""


def extract_solution(solution_str: str) -> str:
    """The number after ``#### `` in a GSM8K answer, commas removed (as verl's preprocessing does)."""
    solution = re.search("#### (\\-?[0-9\\.\\,]+)", solution_str)
    if solution is None:
        raise ValueError(f"no '#### <number>' in GSM8K answer: {solution_str[-200:]!r}")
    return solution.group(0).split("#### ")[1].replace(",", "")


def make_row(example: Mapping[str, Any], idx: int, split: str) -> dict:
    """One verl row from a GSM8K example ({"question", "answer"}), exactly verl's process_fn."""
    question_raw = example["question"]
    answer_raw = example["answer"]
    extra_info = {"split": split, "index": idx, "answer": answer_raw, "question": question_raw}
    for key in ("template", "params"):  # generated sample only
        if key in example:
            extra_info[key] = example[key]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question_raw + " " + INSTRUCTION}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": extract_solution(answer_raw)},
        "extra_info": extra_info,
    }


def to_verl_rows(examples: Iterable[Mapping[str, Any]], split: str) -> list[dict]:
    return [make_row(ex, idx, split) for idx, ex in enumerate(examples)]


def offline_hint(option: str = "--offline-sample N") -> str:
    return (f"Could not load {DATA_SOURCE!r} (config {HUB_CONFIG!r}) from the Hugging Face Hub. If this machine is "
            f"offline, pass --local_dataset_path DIR (a local copy of the dataset), or pass {option} to write N "
            "GSM8K-format problems that this project generates itself (templated arithmetic word problems, "
            "no GSM8K data).")


def load_gsm8k(local_dataset_path: str | None = None):
    """(train, test) of openai/gsm8k via ``datasets.load_dataset``; :class:`GSM8KUnavailable` when that fails."""
    try:
        import datasets

        dataset = datasets.load_dataset(local_dataset_path or DATA_SOURCE, HUB_CONFIG)
        return dataset["train"], dataset["test"]
    except Exception as exc:  # ConnectionError, OfflineModeIsEnabled, DatasetNotFoundError, ...
        raise GSM8KUnavailable(f"{offline_hint()}\n(cause: {type(exc).__name__}: {exc})") from exc


# ----------------------------------------------------------------------------------------------------------------
# generated GSM8K-format sample

PEOPLE = (("Maya", "She", "her"), ("Tom", "He", "his"), ("Priya", "She", "her"), ("Diego", "He", "his"),
          ("Hana", "She", "her"), ("Kofi", "He", "his"), ("Lena", "She", "her"), ("Ravi", "He", "his"),
          ("Sara", "She", "her"), ("Ben", "He", "his"))
ITEMS = ("stickers", "marbles", "pencils", "cookies", "cards", "beads", "stamps", "crayons")


def _calc(expr: str, value: int) -> str:
    """GSM8K's calculator annotation: ``48/2 = <<48/2=24>>24``."""
    return f"{expr} = <<{expr}={value}>>{value}"


def _t_packs(rng: random.Random):
    (name, he, _), item = rng.choice(PEOPLE), rng.choice(ITEMS)
    a, b = rng.randint(2, 12), rng.randint(3, 24)
    c = rng.randint(2, a * b - 1)
    total = a * b
    left = total - c
    q = (f"{name} buys {a} packs of {item}. Each pack has {b} {item}. {he} gives {c} {item} to friends. "
         f"How many {item} does {name} have left?")
    ans = (f"{name} buys {_calc(f'{a}*{b}', total)} {item}.\n"
           f"After giving some away, {he.lower()} has {_calc(f'{total}-{c}', left)} {item} left.\n#### {left}")
    return q, ans, left, {"a": a, "b": b, "c": c}


def _t_savings(rng: random.Random):
    name, he, his = rng.choice(PEOPLE)
    rate, hours = rng.randint(8, 25), rng.randint(5, 20)
    earned = rate * hours
    spend = rng.randint(1, earned - 1)
    weeks = rng.randint(2, 8)
    saved = earned - spend
    total = saved * weeks
    q = (f"{name} earns ${rate} an hour and works {hours} hours a week. Every week {he.lower()} spends ${spend} "
         f"of {his} pay. How much money does {name} save in {weeks} weeks?")
    ans = (f"Each week {name} earns {_calc(f'{rate}*{hours}', earned)} dollars.\n"
           f"{he} saves {_calc(f'{earned}-{spend}', saved)} dollars a week.\n"
           f"In {weeks} weeks {he.lower()} saves {_calc(f'{saved}*{weeks}', total)} dollars.\n#### {total}")
    return q, ans, total, {"rate": rate, "hours": hours, "spend": spend, "weeks": weeks}


def _t_boxes(rng: random.Random):
    (name, he, _), item = rng.choice(PEOPLE), rng.choice(ITEMS)
    boxes, per = rng.randint(2, 9), rng.randint(3, 15)
    total = boxes * per
    extra = rng.randint(2, 10)
    final = per + extra
    q = (f"{name} shares {total} {item} equally among {boxes} boxes. Then {he.lower()} adds {extra} more {item} "
         f"to each box. How many {item} are in each box now?")
    ans = (f"Each box first gets {_calc(f'{total}/{boxes}', per)} {item}.\n"
           f"After adding more, each box has {_calc(f'{per}+{extra}', final)} {item}.\n#### {final}")
    return q, ans, final, {"total": total, "boxes": boxes, "extra": extra}


def _t_trip(rng: random.Random):
    v1, t1, v2, t2 = rng.randint(20, 70), rng.randint(1, 6), rng.randint(20, 70), rng.randint(1, 6)
    d1, d2 = v1 * t1, v2 * t2
    total = d1 + d2
    q = (f"A train travels at {v1} miles per hour for {t1} hours, then at {v2} miles per hour for {t2} hours. "
         "How many miles does the train travel in total?")
    ans = (f"In the first part it travels {_calc(f'{v1}*{t1}', d1)} miles.\n"
           f"In the second part it travels {_calc(f'{v2}*{t2}', d2)} miles.\n"
           f"In total it travels {_calc(f'{d1}+{d2}', total)} miles.\n#### {total}")
    return q, ans, total, {"v1": v1, "t1": t1, "v2": v2, "t2": t2}


def _t_discount(rng: random.Random):
    name, he, _ = rng.choice(PEOPLE)
    price = 20 * rng.randint(2, 15)
    pct = rng.choice((10, 20, 25, 50))
    off = price * pct // 100
    paid = price - off
    q = (f"A jacket costs ${price}. During a sale it is {pct}% off. How many dollars does {name} pay for the "
         "jacket during the sale?")
    ans = (f"The discount is {_calc(f'{price}*{pct}/100', off)} dollars.\n"
           f"{name} pays {_calc(f'{price}-{off}', paid)} dollars.\n#### {paid}")
    return q, ans, paid, {"price": price, "pct": pct}


def _t_ages(rng: random.Random):
    (a, _, _), (b, _, _) = rng.sample(PEOPLE, 2)
    b_age, k, years = rng.randint(3, 15), rng.randint(2, 4), rng.randint(2, 10)
    a_now = k * b_age
    a_later = a_now + years
    q = f"{a} is {k} times as old as {b}. {b} is {b_age} years old. How old will {a} be in {years} years?"
    ans = (f"{a} is {_calc(f'{k}*{b_age}', a_now)} years old now.\n"
           f"In {years} years {a} will be {_calc(f'{a_now}+{years}', a_later)} years old.\n#### {a_later}")
    return q, ans, a_later, {"k": k, "b_age": b_age, "years": years}


def _t_class(rng: random.Random):
    f = rng.choice((2, 3, 4, 5))
    students = f * rng.randint(4, 8)
    soccer = students // f
    rest = students - soccer
    basketball = rng.randint(2, rest - 1)
    neither = rest - basketball
    q = (f"A class has {students} students. One out of every {f} students plays soccer. Of the other students, "
         f"{basketball} play basketball. How many students play neither sport?")
    ans = (f"{_calc(f'{students}/{f}', soccer)} students play soccer.\n"
           f"{_calc(f'{students}-{soccer}', rest)} students do not play soccer.\n"
           f"{_calc(f'{rest}-{basketball}', neither)} students play neither sport.\n#### {neither}")
    return q, ans, neither, {"students": students, "f": f, "basketball": basketball}


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, str, int, dict]]] = {
    "packs": _t_packs, "savings": _t_savings, "boxes": _t_boxes, "trip": _t_trip,
    "discount": _t_discount, "ages": _t_ages, "class": _t_class,
}


def generate_sample(count: int, seed: int | str = 0, exclude: Iterable[str] = ()) -> list[dict]:
    """``count`` distinct generated problems {"question", "answer", "template", "params" (JSON)}, seeded.

    Templates cycle in a fixed order; questions in ``exclude`` are skipped (so train and test do not overlap).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(f"gsm8k-sample:{seed}")
    names = list(TEMPLATES)
    seen = set(exclude)
    out: list[dict] = []
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 100 * (count + 10):  # pragma: no cover - the templates have millions of instances
            raise RuntimeError("cannot generate enough distinct problems")
        template = names[len(out) % len(names)]
        question, answer, _, params = TEMPLATES[template](rng)
        if question in seen:
            continue
        seen.add(question)
        out.append({"question": question, "answer": answer, "template": template, "params": json.dumps(params)})
    return out


def sample_splits(n_train: int, n_test: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    test = generate_sample(n_test, seed=f"{seed}:test")
    train = generate_sample(n_train, seed=f"{seed}:train", exclude=[ex["question"] for ex in test])
    return train, test

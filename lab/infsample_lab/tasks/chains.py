"""Chain arithmetic for the demo: "add 41 and 7", "what is 5 times 3", "count to 9", scored by the final answer.

A chain prompt reaches its answer from a start in m equal increments (``chain_prompt``). The demo's answers are
either a guess (``answer : v .``, seldom right) or counting up to the answer (``count : ... . answer : v .``, always
right), drawn by ``guess_or_count``: the tiny "learns" model trains on them (``models.tiny_corpus``), and GRPO with
this reward teaches it to count within a few steps, which is what ``make demo`` shows.
"""

from __future__ import annotations

import random
import re
from typing import Any

from .draws import loguniform

DATA_SOURCE = "infsample/chains"
ABILITY = "arithmetic"
ANSWER = re.compile(r"answer : (-?\d+) \.\s*$")
MAX_STEPS = 9  # the demo's chains: short enough to count up to within a response
# Every prompt is answered at random in one of two modes: a guess, right only GUESS_RIGHT of the time, or counting up
# to the answer, always right. A reward that checks the answer pays counting several times as often as guessing, and
# the mode is the answer's first token: the one choice GRPO has to learn, the same for every prompt.
ANSWER_MODES = {"guess": 0.7, "count": 0.3}
GUESS_RIGHT = 0.2


def chain_prompt(rng: random.Random, max_steps: int) -> tuple[str, int, int, int]:
    """(prompt, start, increment, steps m): the answer is start + increment * m, reached in m increments."""
    m = loguniform(rng, 3, max_steps)
    r = rng.random()
    if r < 0.35:
        return f"count to {m}", 0, 1, m
    if r < 0.7:
        a = rng.randint(1, 60)
        return f"add {a} and {m}", a, 1, m
    b = rng.randint(2, 12)
    return f"what is {m} times {b}", 0, b, m


def guess_or_count(rng: random.Random, mode: str | None = None) -> tuple[str, str]:
    """One (prompt, answer) pair of the demo; ``mode`` (guess, count) is drawn by weight if None."""
    prompt, start, inc, m = chain_prompt(rng, MAX_STEPS)
    if mode is None:
        mode = rng.choices(list(ANSWER_MODES), weights=list(ANSWER_MODES.values()))[0]
    values = [start + inc * i for i in range(m + 1)]
    if mode == "guess":
        right = rng.random() < GUESS_RIGHT
        return prompt, f"answer : {values[-1] if right else values[-1] + rng.choice([-2, -1, 1, 2]) * inc} ."
    if mode == "count":
        return prompt, "count : " + " ".join(map(str, values[1:])) + f" . answer : {values[-1]} ."
    raise ValueError(f"unknown mode {mode!r}: one of {', '.join(ANSWER_MODES)}")


def chain_answer(prompt: str) -> int:
    """The right answer to a chain prompt ("add 41 and 7" -> 48)."""
    words = prompt.split()
    if words[:2] == ["count", "to"]:
        return int(words[2])
    if words[0] == "add":
        return int(words[1]) + int(words[3])
    if words[:2] == ["what", "is"] and words[3] == "times":
        return int(words[2]) * int(words[4])
    raise ValueError(f"not a chain prompt: {prompt!r}")


def make_rows(count: int, seed: int, split: str) -> list[dict]:
    """verl's parquet rows (the layout of verl's examples/data_preprocess/gsm8k.py) of ``count`` chain prompts."""
    rng = random.Random(seed)
    rows = []
    for idx in range(count):
        prompt = guess_or_count(rng)[0]
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": prompt}], "ability": ABILITY,
                     "reward_model": {"style": "rule", "ground_truth": str(chain_answer(prompt))},
                     "extra_info": {"split": split, "index": idx}})
    return rows


def compute_score(data_source: Any = None, solution_str: Any = None, ground_truth: Any = None,
                  extra_info: Any = None, **kwargs: Any) -> float:
    """1.0 when the response ends with ``answer : N .`` and N is the right answer, else 0.0."""
    match = ANSWER.search(str(solution_str or "").strip())
    return 1.0 if match and int(match.group(1)) == int(str(ground_truth).strip()) else 0.0

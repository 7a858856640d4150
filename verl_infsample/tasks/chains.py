"""Chain arithmetic for the demo: "add 41 and 7", "what is 5 times 3", "count to 9", scored by the final answer.

The prompts are those of the tiny "learns" model's corpus (``models.tiny_corpus.learns_example``), which answers
them either with a guess (``answer : v .``, seldom right) or by counting up to the answer (``count : ... . answer : v
.``, mostly right): GRPO with this reward learns to count within a few steps, which is what ``make demo`` shows.
"""

from __future__ import annotations

import random
import re
from typing import Any

from ..models.tiny_corpus import chain_answer, learns_example

DATA_SOURCE = "infsample/chains"
ABILITY = "arithmetic"
ANSWER = re.compile(r"answer : (-?\d+) \.\s*$")


def make_rows(count: int, seed: int, split: str) -> list[dict]:
    """verl's parquet rows (the layout of verl's examples/data_preprocess/gsm8k.py) of ``count`` chain prompts."""
    rng = random.Random(seed)
    rows = []
    for idx in range(count):
        prompt = learns_example(rng)[0]
        rows.append({"data_source": DATA_SOURCE, "prompt": [{"role": "user", "content": prompt}], "ability": ABILITY,
                     "reward_model": {"style": "rule", "ground_truth": str(chain_answer(prompt))},
                     "extra_info": {"split": split, "index": idx}})
    return rows


def compute_score(data_source: Any = None, solution_str: Any = None, ground_truth: Any = None,
                  extra_info: Any = None, **kwargs: Any) -> float:
    """1.0 when the response ends with ``answer : N .`` and N is the right answer, else 0.0."""
    match = ANSWER.search(str(solution_str or "").strip())
    return 1.0 if match and int(match.group(1)) == int(str(ground_truth).strip()) else 0.0

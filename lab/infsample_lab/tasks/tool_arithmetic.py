"""Arithmetic questions for a tool agent ("add 41 and 17"), scored by the final answer after the calculator's help.

The tiny "tools" model trains on these questions (``arithmetic_question``; its corpus is
``models.tiny_tools_corpus``): it answers by calling the calculator (``<tool_call>`` ... ``</tool_call>``), reads the
tool's response and ends with ``answer : 58 .``. The rows run verl's ToolAgentLoop (``agent_name: tool_agent``) and
pass the ground truth to the calculator tool (``extra_info.tools_kwargs``), which scores each call.
"""

from __future__ import annotations

import random
import re
from typing import Any

from . import calculator

DATA_SOURCE = "infsample/tool_arithmetic"
ABILITY = "arithmetic"
AGENT_NAME = "tool_agent"  # verl's ToolAgentLoop
ANSWER = re.compile(r"answer : (-?\d+(?:\.\d+)?) \.\s*$")

# Question forms per operator; the expression the model writes is "a op b", the numbers in the question's order
# (forms that name b first, "subtract 17 from 41", left a briefly trained model writing mostly wrong expressions).
QUESTION_FORMS = {
    "+": ("what is {a} plus {b}", "add {a} and {b}", "{a} + {b}", "the sum of {a} and {b}"),
    "-": ("what is {a} minus {b}", "{a} - {b}"),
    "*": ("what is {a} times {b}", "multiply {a} by {b}", "{a} * {b}", "the product of {a} and {b}"),
}
OPERAND_RANGE = (2, 99)


def arithmetic_question(rng: random.Random) -> tuple[str, str]:
    """(question, expression): "add 41 and 17" -> "41 + 17"."""
    op = rng.choice(list(QUESTION_FORMS))
    a, b = rng.randint(*OPERAND_RANGE), rng.randint(*OPERAND_RANGE)
    return rng.choice(QUESTION_FORMS[op]).format(a=a, b=b), f"{a} {op} {b}"


def make_rows(count: int, seed: int, split: str) -> list[dict]:
    """verl's parquet rows: a chat ``prompt``, ``agent_name``, the ground truth, and the tool's create kwargs.
    Seeded apart from the model's corpus (which draws from ``random.Random(0)``): other questions than it learnt."""
    rng = random.Random(f"{DATA_SOURCE}/{seed}")
    rows = []
    for idx in range(count):
        question, expression = arithmetic_question(rng)
        truth = calculator.format_value(calculator.evaluate(expression))
        rows.append({"data_source": DATA_SOURCE, "agent_name": AGENT_NAME,
                     "prompt": [{"role": "user", "content": question}], "ability": ABILITY,
                     "reward_model": {"style": "rule", "ground_truth": truth},
                     "extra_info": {"split": split, "index": idx, "expression": expression,
                                    "tools_kwargs": {calculator.NAME: {"create_kwargs": {"ground_truth": truth}}}}})
    return rows


def compute_score(data_source: Any = None, solution_str: Any = None, ground_truth: Any = None,
                  extra_info: Any = None, **kwargs: Any) -> float:
    """1.0 when the response (tool call, tool response and answer) ends with ``answer : N .`` and N is right."""
    match = ANSWER.search(str(solution_str or "").strip())
    return 1.0 if match and match.group(1) == str(ground_truth).strip() else 0.0

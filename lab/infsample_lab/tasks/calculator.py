"""A safe arithmetic calculator: the tool the tiny "tools" model calls, and its OpenAI function schema.

``evaluate("41 + 17")`` parses the expression with :mod:`ast` and computes it from numbers, ``+ - * / // % **`` and
parentheses only: no names, calls, attributes or anything else Python would run, and bounds on the expression's
length, the size of powers and of the result. Bad input raises :class:`CalculatorError` saying what was refused and
what is accepted. ``respond(expression)`` is the text the tool hands back to the model (``"41 + 17 = 58"``, or
``"error: ..."``): verl's tool wrappers (``calculator_tool.CalculatorTool``, ``examples/tools/function_tools.py``)
and the tiny model's training corpus use this one function, so the model sees in training what the tool returns.

Pure Python: no verl, torch or numpy here.
"""

from __future__ import annotations

import ast
import math
import operator

NAME = "calculator"
DESCRIPTION = "Evaluate an arithmetic expression."
EXPRESSION_DESCRIPTION = "The expression, e.g. 41 + 17"
# The schema as verl renders it into the prompt (``tool_schema.model_dump(exclude_unset=True, exclude_none=True)``,
# key order included): the tiny "tools" model was trained on exactly this.
SCHEMA: dict = {"type": "function",
                "function": {"name": NAME, "description": DESCRIPTION,
                             "parameters": {"type": "object",
                                            "properties": {"expression": {"type": "string",
                                                                          "description": EXPRESSION_DESCRIPTION}},
                                            "required": ["expression"]}}}

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_ABS_RESULT = 10 ** 18
ACCEPTED = "numbers, + - * / // % ** and parentheses"

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message says why and what it accepts."""


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic ``expression`` (int where exact, else float); CalculatorError on bad input."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise CalculatorError(f"empty expression: write one with {ACCEPTED}, e.g. 41 + 17")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression of {len(text)} characters; at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {text!r}: write it with {ACCEPTED}, e.g. 41 + 17") from None
    value = _eval(tree.body, text)
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError(f"{text!r} has no finite value")
    if abs(value) > MAX_ABS_RESULT:
        raise CalculatorError(f"{text!r} is larger than {MAX_ABS_RESULT:.0e} in magnitude")
    return value


def _eval(node: ast.AST, text: str) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, text), _eval(node.right, text)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} in {text!r} is too large; at most {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError(f"division by zero in {text!r}") from None
        except OverflowError:
            raise CalculatorError(f"{text!r} overflows") from None
        if isinstance(value, complex):
            raise CalculatorError(f"{text!r} has no real value")
        if isinstance(node.op, ast.Div) and isinstance(value, float) and value.is_integer():
            value = int(value)
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, text))
    what = ast.get_source_segment(text, node) or type(node).__name__
    raise CalculatorError(f"{what!r} is not allowed in {text!r}: only {ACCEPTED}")


def format_value(value: int | float) -> str:
    """58 -> "58", 3.5 -> "3.5", 1/3 -> "0.333333" (six significant digits past an integer part)."""
    if isinstance(value, int):
        return str(value)
    return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"


def respond(expression) -> str:
    """What the tool answers: ``"41 + 17 = 58"``, or ``"error: <why>"`` for an expression it refuses."""
    try:
        value = evaluate(expression)
    except CalculatorError as e:
        return f"error: {e}"
    return f"{str(expression).strip()} = {format_value(value)}"

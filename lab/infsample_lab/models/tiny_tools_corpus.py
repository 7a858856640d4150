"""The "tools" tiny model's corpus: arithmetic questions answered with a calculator call, as a tool agent does.

Each example is one conversation in the chat template's tool layout (Qwen3's), tokenized the way verl's ToolAgentLoop
builds it turn by turn:

    <|im_start|>system\\n# Tools ... <tools>\\n{calculator's schema}\\n</tools> ... <|im_end|>\\n
    <|im_start|>user\\nadd 41 and 17<|im_end|>\\n<|im_start|>assistant\\n                          (context)
    <tool_call>\\n{"name": "calculator", "arguments": {"expression": "41 + 17"}}\\n</tool_call><|im_end|>   (learnt)
    \\n<|im_start|>user\\n<tool_response>\\n41 + 17 = 58\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n                                                                      (context)
    answer : 58 .<|im_end|>                                                                       (learnt)

The tool response is ``tasks.calculator.respond``'s text, what the real tool returns. The renderers here write the
template by hand (as ``tiny_tokenizer.render_chat`` does for plain chats); the tests check them against
``apply_chat_template(..., tools=...)`` and verl's turn-by-turn token building.
"""

from __future__ import annotations

import json
import random

from ..tasks import calculator
from ..tasks.tool_arithmetic import arithmetic_question
from .tiny_dialogue import Dialogue, Segment

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
# Single tokens in the "tools" model's vocabulary (added, not special), as in Qwen3's.
TOOL_TOKENS = (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END)

TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_INSTRUCTIONS = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                      "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                      '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

def tools_system_block(tools: list[dict], system: str | None = None) -> str:
    """The system turn the template writes when ``tools`` are given (``system``: a system message's content)."""
    head = f"{IM_START}system\n" + (f"{system}\n\n" if system else "")
    listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return f"{head}{TOOLS_PREAMBLE}{listed}{TOOLS_INSTRUCTIONS}{IM_END}\n"


def render_tool_prompt(question: str, tools: list[dict]) -> str:
    """``apply_chat_template([user question], tools=tools, add_generation_prompt=True)`` by hand."""
    return f"{tools_system_block(tools)}{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"


def tool_call_text(name: str, arguments: dict) -> str:
    """One call as the template writes it (and the hermes parser reads it)."""
    args = json.dumps(arguments, ensure_ascii=False)
    return f'{TOOL_CALL}\n{{"name": "{name}", "arguments": {args}}}\n{TOOL_CALL_END}'


def tool_response_text(contents: list[str]) -> str:
    """The context after an assistant's ``<|im_end|>``: its newline, the tool responses in one user turn, and the
    next generation prompt (what verl's ToolAgentLoop appends before the next turn)."""
    body = "".join(f"\n{TOOL_RESPONSE}\n{c}\n{TOOL_RESPONSE_END}" for c in contents)
    return f"\n{IM_START}user{body}{IM_END}\n{IM_START}assistant\n"


def final_answer(value: str) -> str:
    return f"answer : {value} ."


def tools_example(rng: random.Random) -> Dialogue:
    """One conversation: the question, the calculator call, the tool's response, the answer that uses it."""
    question, expression = arithmetic_question(rng)
    response = calculator.respond(expression)
    return Dialogue((
        Segment(render_tool_prompt(question, [calculator.SCHEMA]), learn=False),
        Segment(tool_call_text(calculator.NAME, {"expression": expression}) + IM_END, learn=True),
        Segment(tool_response_text([response]), learn=False),
        Segment(final_answer(calculator.format_value(calculator.evaluate(expression))) + IM_END, learn=True),
    ))

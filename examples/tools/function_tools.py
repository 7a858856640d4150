"""The calculator as a verl function tool: actor_rollout_ref.rollout.multi_turn.function_tool_path=<this file>.

verl executes this file once per agent-loop worker and registers every ``@function_tool``; the schema it shows the
model comes from the signature and the docstring below (transformers' ``get_json_schema``), which say what
``calculator_tool.yaml`` says, so either way the model sees the same tool.
"""

from verl.tools.function_tool import function_tool

from infsample_lab.tasks.calculator import respond


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. 41 + 17
    """
    return respond(expression)

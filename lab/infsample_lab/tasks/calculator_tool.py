"""The calculator as a verl tool (a ``BaseTool``), for ``actor_rollout_ref.rollout.multi_turn.tool_config_path``.

    tools:
      - class_name: infsample_lab.tasks.calculator_tool.CalculatorTool
        config: {type: native}
        tool_schema: ...            # optional: the calculator's own (tasks.calculator.SCHEMA) when left out

See ``examples/tools/calculator_tool.yaml``. The tool answers with ``tasks.calculator.respond`` (``"41 + 17 = 58"``,
or ``"error: ..."`` for an expression it refuses, which the model reads as the tool's answer). A trajectory's
``create_kwargs`` (the dataset's ``extra_info.tools_kwargs.calculator.create_kwargs``) may carry the question's
``ground_truth``: each call's step reward is then 1.0 when the tool's result equals it, else 0.0 (verl keeps step
rewards in the sample's ``tool_rewards``).

Imports verl: load it only where verl is installed (the agent-loop workers do).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from . import calculator


class CalculatorTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(calculator.SCHEMA))
        self._ground_truth: dict[str, str | None] = {}

    async def create(self, instance_id: str | None = None, create_kwargs: dict | None = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        """ToolAgentLoop passes the trajectory's ``tools_kwargs["calculator"]["create_kwargs"]``."""
        instance_id = instance_id or str(uuid4())
        truth = (create_kwargs or {}).get("ground_truth")
        self._ground_truth[instance_id] = None if truth is None else str(truth).strip()
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float,
                                                                                               dict]:
        expression = parameters.get("expression")
        if not isinstance(expression, str):
            return (ToolResponse(text='error: call calculator with {"expression": "<arithmetic>"}, e.g. '
                                      '{"expression": "41 + 17"}'), 0.0, {"calculator_error": 1.0})
        text = calculator.respond(expression)
        if text.startswith("error:"):
            return ToolResponse(text=text), 0.0, {"calculator_error": 1.0}
        truth = self._ground_truth.get(instance_id)
        reward = 0.0 if truth is None else float(text.rsplit(" = ", 1)[1] == truth)
        return ToolResponse(text=text), reward, {"calculator_error": 0.0}

    async def release(self, instance_id: str, **kwargs) -> None:
        self._ground_truth.pop(instance_id, None)

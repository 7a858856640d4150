"""How well a tiny "tools" model uses its calculator, measured the way verl's ToolAgentLoop would run it.

``measure_tool_use(model_dir, n)`` samples ``n`` first turns (temperature 1, transformers ``generate``) for held-out
questions rendered with ``apply_chat_template(..., tools=[calculator schema])``, parses each with verl's
``HermesToolParser``, runs the calculator on the parsed calls, appends the tool response with verl's Continuous Token
builder (what ToolAgentLoop does), samples the second turn and checks its ``answer : N .`` against the true value.

Imports torch, transformers and verl inside the function only.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field

from ..tasks import calculator
from ..tasks.tool_arithmetic import arithmetic_question
from .tiny_tools_corpus import final_answer

HELD_OUT_SEED = 20_000  # the corpus is drawn from seed 0


@dataclass
class ToolUseStats:
    n: int
    parsed_calls: int = 0  # first turns with a call HermesToolParser parses, to the calculator, with an expression
    right_expressions: int = 0  # ... whose expression is the question's
    answers_as_tool_said: int = 0  # second turns whose answer is the value the tool returned
    right_answers: int = 0  # second turns whose answer is the true value (of all n)
    examples: list[str] = field(default_factory=list)  # a few questions and the turns that followed

    @property
    def call_rate(self) -> float:
        return self.parsed_calls / self.n

    @property
    def answer_rate(self) -> float:
        return self.right_answers / self.n


def held_out_questions(n: int, seed: int = HELD_OUT_SEED) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [arithmetic_question(rng) for _ in range(n)]


def measure_tool_use(model_dir, n: int = 64, seed: int = 0, temperature: float = 1.0, model=None,
                     tokenizer=None, keep_examples: int = 3) -> ToolUseStats:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import HermesToolParser
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_dir)
    mdl = model if model is not None else AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    builder = create_continuous_token_builder(tok, hf_model_type=mdl.config.model_type)
    parser = HermesToolParser(tok)
    tools = [calculator.SCHEMA]
    questions = held_out_questions(n)
    messages = [[{"role": "user", "content": q}] for q, _ in questions]
    prompts = [builder.build_initial_tokens(m, tools=tools) for m in messages]
    stats = ToolUseStats(n=n)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        first = _generate(mdl, tok, prompts, 48, temperature)
        second_prompts, second_rows = [], []
        for i, ((_, expression), resp) in enumerate(zip(questions, first)):
            content, calls = asyncio.run(parser.extract_tool_calls(resp))
            call = calls[0] if calls else None
            args = _arguments(call)
            if call is None or call.name != calculator.NAME or not isinstance(args.get("expression"), str):
                continue
            stats.parsed_calls += 1
            stats.right_expressions += args["expression"].strip() == expression
            ids = builder.merge_assistant_tokens(prompts[i], resp).token_ids
            history = messages[i] + [{"role": "assistant", "content": content,
                                      "tool_calls": [{"type": "function",
                                                      "function": {"name": call.name, "arguments": args}}]}]
            updated = history + [{"role": "tool", "content": calculator.respond(args["expression"])}]
            second_prompts.append(builder.merge_context_tokens(history, updated, ids, tools=tools).token_ids)
            second_rows.append((i, args["expression"]))
        second = _generate(mdl, tok, second_prompts, 16, temperature) if second_prompts else []
    for (i, written), prompt, resp in zip(second_rows, second_prompts, second):
        text = tok.decode(resp, skip_special_tokens=True).strip()
        stats.right_answers += text == final_answer(calculator.format_value(calculator.evaluate(questions[i][1])))
        said = calculator.respond(written)
        stats.answers_as_tool_said += " = " in said and text == final_answer(said.rsplit(" = ", 1)[1])
        if len(stats.examples) < keep_examples:
            stats.examples.append(f"{questions[i][0]} -> " + tok.decode(prompt[len(prompts[i]):] + resp))
    return stats


def _arguments(call) -> dict:
    if call is None:
        return {}
    try:
        args = json.loads(call.arguments)
    except (TypeError, ValueError):
        return {}
    return args if isinstance(args, dict) else {}


def _generate(mdl, tok, prompts: list[list[int]], max_new_tokens: int, temperature: float,
              batch_size: int = 32) -> list[list[int]]:
    """Sampled continuations (left-padded batches), each cut after its first eos."""
    import torch

    eos, pad = tok.eos_token_id, tok.pad_token_id
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        gen = mdl.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=True,
                           temperature=temperature, top_p=1.0, top_k=None, eos_token_id=eos, pad_token_id=pad)
        for row in gen[:, width:].tolist():
            out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out

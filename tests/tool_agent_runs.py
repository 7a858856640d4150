"""End to end, verl's tool agent loop (``examples/tools/run_grpo_cpu.sh``, as a user runs it; about 2 minutes a run
on 2 cores): two GRPO steps through verl's real trainer with multi-turn on. verl's metrics show a tool round in most
trajectories (4 turns: prompt, call, tool response, answer), right answers, and step 2's rollout log-probs equal to
the trainer's over the model's own tokens of both turns (the tool response masked out). The runs are in
``test_tool_agent_grpo.py`` (our transformers engine with the YAML tool, and verl's own vLLM rollout) and
``test_tool_agent_vllm.py`` (verl's vLLM server with our scheduling, probes and the function tool).

Set INFSAMPLE_SKIP_E2E=1 to skip them.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "examples" / "tools"
SCRIPT = TOOLS / "run_grpo_cpu.sh"
STEPS_N, STEPS_BATCH = 16, 2
e2e = pytest.mark.skipif(bool(os.environ.get("INFSAMPLE_SKIP_E2E")), reason="INFSAMPLE_SKIP_E2E is set")


def train(work: Path, model_dir: str, rollout: str, engine: str, tool: str, *overrides: str
           ) -> dict[int, dict[str, float]]:
    """Two GRPO steps of the example script, as a user runs it; verl's console metrics per step."""
    from verl_infsample.bench.in_verl import parse_step_lines

    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "RAY_ADDRESS")}
    env.update(MODEL_PATH=model_dir, PYTHON=sys.executable, STEPS="2", N=str(STEPS_N), BATCH=str(STEPS_BATCH),
               NGPUS="1", ROLLOUT=rollout, ENGINE=engine, TOOL=tool)
    work.parent.mkdir(parents=True, exist_ok=True)
    # a learning rate that moves every weight (Adam), so step 2 samples with other weights than step 1
    proc = subprocess.run(["bash", str(SCRIPT), str(work), "actor_rollout_ref.actor.optim.lr=1e-3",
                           "actor_rollout_ref.actor.entropy_coeff=0.01", *overrides], capture_output=True, text=True,
                          timeout=1100, env=env, cwd=work.parent)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    steps = parse_step_lines(output)
    assert sorted(steps) == [1, 2], output[-6000:]
    return steps


def check_tool_rounds(steps: dict[int, dict[str, float]]) -> None:
    """verl's own metrics of a GRPO run whose trajectories went through a tool round."""
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
    # step 2 was sampled with the weights step 1 trained, and the rollout's log-probs of the model's own tokens (both
    # turns; the tool response is masked out) equal the trainer's
    assert steps[2]["training/rollout_probs_diff_max"] < 1e-3



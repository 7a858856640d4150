"""End to end: ``python -m verl.trainer.main_ppo`` trains the tiny model for 2 GRPO steps on generated
knights-and-knaves puzzles on the CPU, through verl's real V1 trainer, FSDP2 workers, Ray, TransferQueue, agent and
reward loops and our plugin, by running the example script ``examples/logic_puzzles/run_grpo_cpu.sh`` exactly as a
user would (1.5-2.5 minutes a run on 2 cores): ``_train`` here, run by ``test_grpo_exact.py``, where
``rollout.name=infinite`` on its default engine (the transformers engine, on the CPU) gives the same samples and the
same training metrics step by step whether each group decodes whole (``custom.policy=full``) or by Infinite Sampling
under a small KV budget, and checks that the weights verl syncs to the rollout each step are the ones it decodes with:
with a learning rate that moves every weight (``actor/grad_norm`` > 0), the log-probs the rollout returned in step 2
match the trainer's own to ~1e-6 (``training/rollout_probs_diff_max``); with the sync switched off the same run shows
about 0.7.

``rollout.name=infinite`` on vLLM with probes (in the sync mode and in ``colocate_async``, where verl's aborts land
in probes and rests alike) and verl's own ``rollout.name=vllm`` run through verl's tool agent loop in
``test_tool_agent.py``.

Both read verl's ``step:1`` / ``step:2`` console lines (``parse_step_lines``).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infsample_lab.bench.in_verl import parse_step_lines

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "logic_puzzles" / "run_grpo_cpu.sh"
N, BATCH = 32, 2


def test_parse_step_lines():
    line = ("(TaskRunnerV1 pid=1) step:2 - actor/lr:1e-05 - num_turns/min:np.int32(2) - x/mean:np.float64(-2.5)"
            " - infsample/samples:64 - a/b:nan")
    assert parse_step_lines(line) == {2: {"actor/lr": 1e-05, "num_turns/min": 2.0, "x/mean": -2.5,
                                          "infsample/samples": 64.0}}


def run_two_steps(script: Path, work: Path, knobs: dict[str, str], *overrides: str,
                  steps: int = 2) -> dict[int, dict[str, float]]:
    """Two GRPO steps (or ``steps``) of an example script (``examples/cpu_env.sh``'s ``knobs``), as a user runs it;
    verl's console metrics per step. A run that fails or hangs fails the test with the end of its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "RAY_ADDRESS")}
    env.update(PYTHON=sys.executable, STEPS=str(steps), NGPUS="1", **knobs)
    work.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(["bash", str(script), str(work), *overrides], capture_output=True, text=True,
                              timeout=1100, env=env, cwd=work.parent)
    except subprocess.TimeoutExpired as hung:  # its output comes as bytes, whatever text= says
        output = b"".join(o if isinstance(o, bytes) else o.encode() for o in (hung.stdout or b"", hung.stderr or b""))
        pytest.fail(f"the run took more than {hung.timeout} s; its output ends:\n"
                    f"{output.decode(errors='replace')[-6000:]}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    metrics = parse_step_lines(output)
    assert sorted(metrics) == list(range(1, steps + 1)), output[-6000:]
    return metrics


def _train(work, model_dir, rollout="infinite", engine="auto", n=N, *overrides) -> dict[int, dict[str, float]]:
    """Two GRPO steps of the puzzles example script."""
    return run_two_steps(SCRIPT, work, dict(MODEL_PATH=model_dir, N=str(n), BATCH=str(BATCH), ROLLOUT=rollout,
                                            ENGINE=engine), "actor_rollout_ref.actor.optim.lr=1e-3", *overrides)


def test_merge_rollout_metrics():
    from verl_infsample.integration.rollout.metrics import merge_rollout_metrics

    b1 = {"infsample/samples": 40, "infsample/decode_steps": 50, "infsample/wall_s": 1.0, "infsample/plan_ms": 2.0,
          "infsample/peak_kv_bytes": 100, "infsample/preemptions": 1, "infsample/batches": 1,
          "infsample/total_tokens": 400}
    b2 = {**b1, "infsample/samples": 24, "infsample/decode_steps": 30, "infsample/peak_kv_bytes": 300}
    one_server = merge_rollout_metrics([{}, b1, b2], parallel=False)  # batches one after another: add up
    assert one_server == {"infsample/samples": 64, "infsample/preemptions": 2, "infsample/batches": 2,
                          "infsample/total_tokens": 800, "infsample/decode_steps": 80, "infsample/plan_ms": 4.0,
                          "infsample/wall_s": 2.0, "infsample/peak_kv_bytes": 300}
    two = merge_rollout_metrics([one_server, b1], parallel=True)  # replicas side by side: counts add, times max
    assert two["infsample/samples"] == 104 and two["infsample/decode_steps"] == 80
    assert two["infsample/wall_s"] == 2.0 and two["infsample/peak_kv_bytes"] == 300 and two["infsample/replicas"] == 2
    assert merge_rollout_metrics([{}, {}], parallel=True) == {}


def test_the_plugin_registers_infinite_sync_where_verl_imports_its_v1_trainers():
    """No worker_process_setup_hook needed: verl's TaskRunner imports verl.trainer.ppo.v1, the plugin adds the mode."""
    code = ("import sys, verl; lazy = 'verl_infsample.integration.balance' in sys.modules; "
            "from verl.trainer.ppo.v1 import get_trainer_cls; "
            "print(lazy, get_trainer_cls('infinite_sync').__name__, 'verl_infsample.integration.balance' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                         timeout=300)
    # not imported by `import verl` alone (every Ray worker would pay for it), registered once verl imports v1
    assert out.stdout.split() == ["False", "InfiniteSyncTrainer", "True"]


def test_the_shipped_config_selects_the_infinite_sync_trainer():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(config_name="infinite_grpo")
    assert cfg.trainer.v1.trainer_mode == "infinite_sync" and cfg.trainer.use_v1
    assert cfg.actor_rollout_ref.rollout.name == "infinite"

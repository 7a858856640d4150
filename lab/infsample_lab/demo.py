"""``make demo``: GRPO that learns, through verl's trainer with ``rollout.name=infinite``, on the CPU.

Runs ``examples/chains/run_grpo_cpu.sh`` (the tiny "learns" model on chain arithmetic, ``rollout.n=64``, 8 prompts a
step, 10 steps; about 5 minutes here after setup), shows a progress bar over the training steps, then prints one
row per step (mean reward, response length, the rollout server's own seconds, its decode steps against their
lower bound, peak KV) and writes a plot of reward and rollout time per step. verl's full output goes to
``WORK_DIR/run.log``.

    python -m infsample_lab.demo [--work-dir /tmp/infsample_demo] [--steps 10] [extra Hydra overrides...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .bench.in_verl import parse_step_lines
from .paths import REPO
from verl_infsample.report import format_table

ROOT = REPO
SCRIPT = ROOT / "examples" / "chains" / "run_grpo_cpu.sh"
COLUMNS = ["step", "reward", "response_len", "gen_s", "decode_steps", "lower_bound", "steps_vs_bound",
           "peak_kv_kib"]


def step_rows(steps: dict[int, dict[str, float]]) -> list[dict]:
    """One table row per step, from verl's parsed console metrics (None where a step lacks one)."""
    rows = []
    for k, m in sorted(steps.items()):
        decode_steps, bound = m.get("infsample/decode_steps"), m.get("infsample/lower_bound_steps")
        wall_s, peak = m.get("infsample/wall_s"), m.get("infsample/peak_kv_bytes")
        rows.append({"step": k, "reward": m.get("critic/score/mean"), "response_len": m.get("response_length/mean"),
                     "gen_s": None if wall_s is None else round(wall_s, 2),
                     "decode_steps": None if decode_steps is None else int(decode_steps),
                     "lower_bound": None if bound is None else int(bound),
                     "steps_vs_bound": round(decode_steps / bound, 3) if decode_steps and bound else None,
                     "peak_kv_kib": None if peak is None else round(peak / 1024, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", default="/tmp/infsample_demo", help="data, run.log and the plot go here")
    p.add_argument("--steps", type=int, default=10)
    args, overrides = p.parse_known_args(argv)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    log_path, plot_path = work / "run.log", work / "demo.png"
    env = {**os.environ, "STEPS": str(args.steps), "PYTHON": os.environ.get("PYTHON", sys.executable)}
    from tqdm import tqdm

    print(f"make demo: GRPO on chain arithmetic, tiny model, rollout.name=infinite, rollout.n=64, {args.steps} steps "
          f"(verl's output: {log_path})", flush=True)
    bar = tqdm(total=args.steps, desc="GRPO steps", unit="step", file=sys.stderr)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", str(SCRIPT), str(work / "run"), *overrides], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        for line in proc.stdout:
            log.write(line)
            for metrics in parse_step_lines(line).values():  # verl's line for a finished step
                bar.update(1)
                if "critic/score/mean" in metrics:
                    bar.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}")
        rc = proc.wait()
    bar.close()
    steps = parse_step_lines(log_path.read_text())
    if rc != 0 or not steps:
        print(log_path.read_text()[-4000:], file=sys.stderr)
        print(f"make demo: the run failed (exit {rc}); verl's output: {log_path}", file=sys.stderr)
        return rc or 1
    rows = step_rows(steps)
    print(format_table(rows, COLUMNS))
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    k = max(1, min(3, len(rewards) // 2))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    print(f"mean reward: first {k} steps {first:.3f}, last {k} steps {last:.3f}")
    from .bench.plots import plot_demo

    plot_demo(rows, str(plot_path))
    print(f"plot of reward and rollout time per step: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

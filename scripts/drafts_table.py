"""The README's drafts table: what drafts save a GPU user, from ``infsample replay`` (steps exact, seconds modeled).

Four rollouts of each trace, every one through vLLM's own scheduler: verl's ``rollout.name=vllm`` with drafts off,
the same with vLLM's own ``suffix`` drafts (what ``engine_kwargs`` gives any verl user), ``rollout.name=infinite``
with ``custom.speculative=group``, and with ``group_gpu`` (modeled, it does not ship: a device-resident group drafter
that keeps vLLM's async scheduling, ``bench/group_match.py``); on synthetic acceptances also ``infinite`` drafting a
fixed K on every row (``suffix@A``), against which group's budget is measured. The floor: drafts on, none drafted
(the drafts-off steps scheduled synchronously with the group drafter's upkeep), which the host drafter's budget
cannot go under while vLLM drops async scheduling for it. ``--oracle`` adds ``group_oracle``, the bound no budget of
the group drafter beats: its drafts cut to what verification accepts (``replay.drafts``).

    python scripts/drafts_table.py [--text NAME=G.jsonl[:TOKENIZER] ...] [--accept 0.3,0.6] [--replicas 1,8]
        [--caps 4096,16384] [--samples-per-replica 1024] [--history 2] [--seed 907] [--oracle] [--json | --markdown]

``--text``: multi-sample text (``{"prompt_id", "prompt", "responses"}`` a line, ``trace from-text``), its first
``--history`` responses per prompt an earlier step's; the table reports the later step. ``--accept``: synthetic
reasoning-RL traces (``trace synth --rl``, n=16) at each cap, drafts accepted with that probability per token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from verl_infsample.core.text_groups import load_groups, make_tokenizer, trace_from_groups
from verl_infsample.core.trace import synth_rl_trace
from verl_infsample.report import format_table, progress
from infsample_lab.replay.runner import ReplayConfig, replay

LANES = (("vllm", "off"), ("vllm", "suffix"), ("infinite", "group"), ("infinite", "group_gpu"))


def _cell(trace, replicas: int, accept: float | None, seed: int, args) -> dict:
    """One trace on ``replicas``: each lane's modeled seconds and tokens per step, on the trace's last step."""
    lanes = list(LANES) + ([("infinite", "suffix")] if accept is not None else []) \
        + ([("infinite", "group_oracle")] if args.oracle else [])
    rows = {}
    for backend in ("vllm", "infinite"):
        specs = tuple(s for b, s in lanes if b == backend)
        config = ReplayConfig(gpu=args.gpu, model=args.model, replicas=replicas, backends=(backend,), specs=specs,
                              spec_tokens=args.spec_tokens, spec_accept=accept, seed=seed, workers=args.workers,
                              gpu_memory_utilization=args.gpu_memory_utilization)
        out, _ = replay(trace, config)
        last = max(r.step for r in out)
        rows.update({(r.backend, r.spec.split("@")[0]): r for r in out if r.step == last})
    off = rows[("vllm", "off")]
    cell = {"vllm_s": off.model_s, "vllm_steps": off.engine_steps,
            "synchronous_floor_vs_vllm": round(off.synchronous_s / off.model_s, 3)}
    for (backend, spec), r in rows.items():
        key = f"{backend}_{spec}"
        cell[f"{key}_vs_vllm"] = round(r.model_s / off.model_s, 3)
        cell[f"{key}_tokens_per_step"] = r.tokens_per_step
        cell[f"{key}_propose_s"] = r.propose_s
    cell["group_vs_suffix"] = round(rows[("infinite", "group")].model_s / rows[("vllm", "suffix")].model_s, 3)
    if accept is not None:
        cell["group_vs_fixed_k"] = round(rows[("infinite", "group")].model_s / rows[("infinite", "suffix")].model_s, 3)
    return cell


def markdown(rows: list[dict]) -> str:
    """The README's table: each lane's modeled time over verl's ``vllm`` with drafts off."""
    lines = ["| trace | cap | replicas | verl `vllm`: steps, s | `vllm` + `suffix` | `infinite` + `group` | floor | "
             "`group_gpu` (modeled) | group / suffix | group / fixed K | tokens a step: suffix, group, group_gpu |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in rows:
        fixed = f"{c['group_vs_fixed_k']:.3f}" if "group_vs_fixed_k" in c else "-"
        lines.append(f"| {c['trace']} | {c['cap']} | {c['replicas']} | {c['vllm_steps']}, {c['vllm_s']:.3g} | "
                     f"{c['vllm_suffix_vs_vllm']:.3f} | {c['infinite_group_vs_vllm']:.3f} | "
                     f"{c['synchronous_floor_vs_vllm']:.3f} | {c['infinite_group_gpu_vs_vllm']:.3f} | "
                     f"{c['group_vs_suffix']:.3f} | {fixed} | {c['vllm_suffix_tokens_per_step']:.2f}, "
                     f"{c['infinite_group_tokens_per_step']:.2f}, {c['infinite_group_gpu_tokens_per_step']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", action="append", default=[], help="NAME=G.jsonl[:TOKENIZER] (words by default)")
    p.add_argument("--accept", default="0.3,0.6", help="synthetic acceptances (comma-separated; empty: none)")
    p.add_argument("--replicas", default="1,8")
    p.add_argument("--caps", default="4096,16384")
    p.add_argument("--samples-per-replica", type=int, default=1024)
    p.add_argument("--history", type=int, default=2)
    p.add_argument("--spec-tokens", type=int, default=8)
    p.add_argument("--gpu", default="h200")
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=907)
    p.add_argument("--oracle", action="store_true", help="add group_oracle: the group drafter's bound")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    replicas = [int(r) for r in args.replicas.split(",")]
    grid = []
    for spec in args.text:
        name, _, rest = spec.partition("=")
        path, _, tokenizer = rest.partition(":")
        trace = trace_from_groups(load_groups(path, make_tokenizer(tokenizer or "words")), args.history)
        grid += [(name, "-", r, None, trace) for r in replicas]
    for a in (float(x) for x in args.accept.split(",") if x.strip()):
        for cap in (int(c) for c in args.caps.split(",")):
            for r in replicas:
                trace = synth_rl_trace(max(1, r * args.samples_per_replica // 16), 16, cap, steps=1, seed=args.seed)
                grid.append((f"synthetic {a:g}", f"{cap // 1024}k" if cap % 1024 == 0 else str(cap), r, a, trace))
    rows = []
    for name, cap, r, accept, trace in progress(grid, "drafts table"):
        start = time.time()
        cell = {"trace": name, "cap": cap, "replicas": r, **_cell(trace, r, accept, args.seed, args)}
        cell["wall_s"] = round(time.time() - start, 1)
        rows.append(cell)
        print(json.dumps(cell), file=sys.stderr)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    elif args.markdown:
        print(markdown(rows))
    else:
        print(format_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

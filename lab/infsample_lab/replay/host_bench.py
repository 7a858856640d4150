"""``infsample replay-host``: the engine's host time, measured on this machine, as the cost model's fields.

    infsample replay-host --trace T.jsonl [--max-num-seqs 256] [--spec ngram,suffix,group] [--json]

Replays the trace's first step on one replica (the cost model off) at several batch sizes and times vLLM's own
scheduler calls (``schedule`` and ``update_from_output``) per step, fitted as a fixed part and a part per row
(``host_step_s``, ``host_row_s``), and each drafter's calls on the trace's tokens: per row it drafts for
(``propose_*_row_s``) and per row it is called for (``upkeep_*_row_s``: vLLM calls it for every decoding row; its
own proposers draft on each, so theirs is 0). The defaults of ``Calibration`` came from this command on a 2-core CPU; a GPU host's own figures (its
faster cores, and what this leaves out: the model runner's input preparation, the API server) replace them
through ``--calibration``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from verl_infsample.core.trace import read_trace, rollout_steps
from .drafts import DraftSetup
from .hardware import MODELS
from .vllm_replica import ReplicaReplay, ReplicaSetup, ReplayRequest, model_config_dir, prompt_token_ids

BATCHES = (16, 64, 256)
REPEATS = 3  # the scheduler's time per step: the median of this many runs


def _requests(trace, limit: int, vocab: int) -> list[ReplayRequest]:
    out = []
    for p in rollout_steps(trace)[0]:
        tokens = p.prompt_tokens or prompt_token_ids(p.prompt_id, p.prompt_len, vocab)
        for j, n in enumerate(p.lengths):
            out.append(ReplayRequest(f"{p.prompt_id}-{j}", tuple(tokens), n,
                                     tokens=p.tokens[j] if p.tokens is not None else None))
            if len(out) >= limit:
                return out
    return out


def measure_host(trace_path: str, max_num_seqs: int = 256, specs=("ngram", "suffix", "group"),
                 model: str = "qwen3-8b") -> dict:
    """The host fields of ``Calibration`` measured here on ``trace_path``'s first step (see the module docstring)."""
    trace = read_trace(trace_path)
    shape = MODELS[model]
    requests = _requests(trace, 4 * max_num_seqs, shape.vocab)
    max_len = max(len(r.prompt_tokens) + r.length for r in requests) + 64
    need = sum(-(-(len(r.prompt_tokens) + r.length) // 16) for r in requests) + 16

    def run(rows: int, spec: DraftSetup | None):
        setup = ReplicaSetup(num_blocks=need, max_num_seqs=rows, max_model_len=max_len)
        return ReplicaReplay(model_config_dir(shape), setup, None, shape.vocab, fast_forward=False,
                             drafts=spec).run(requests)

    sizes, per_step = [], []
    for rows in sorted({min(b, max_num_seqs) for b in BATCHES} | {max_num_seqs}):
        runs = [run(rows, None) for _ in range(REPEATS)]
        sizes.append(runs[0].running_step_sum / runs[0].engine_steps)
        per_step.append(float(np.median([r.host_wall_s / r.engine_steps for r in runs])))
    print("replay-host: rows per step, scheduler s per step: "
          + ", ".join(f"{n:.1f}: {t * 1e3:.3f} ms" for n, t in zip(sizes, per_step)), file=sys.stderr)
    row_s, step_s = np.polyfit(sizes, per_step, 1) if len(sizes) > 1 else (0.0, per_step[0])
    fields = {"host_step_s": round(max(0.0, float(step_s)), 7), "host_row_s": round(max(0.0, float(row_s)), 8)}
    if any(p.tokens is None for p in trace):
        print("replay-host: the trace has no tokens; the drafters' times need them (trace from-text, "
              "trace from-verl --keep-tokens)", file=sys.stderr)
        return fields
    for spec in specs:
        run(16, DraftSetup(spec))  # compiles what the drafter compiles on first use (ngram's numba kernels)
        res = run(max_num_seqs, DraftSetup(spec))
        if res.drafting_wall_s is None:  # vLLM's own proposers: every row called for drafts
            fields[f"propose_{spec}_row_s"] = round(res.propose_wall_s / max(1, res.proposer_rows), 8)
            fields[f"upkeep_{spec}_row_s"] = 0.0
        else:
            fields[f"propose_{spec}_row_s"] = round(res.drafting_wall_s / max(1, res.proposing_rows), 8)
            fields[f"upkeep_{spec}_row_s"] = round((res.propose_wall_s - res.drafting_wall_s)
                                                   / max(1, res.proposer_rows), 8)
    return fields


def add_replay_host_parser(sub) -> None:
    p = sub.add_parser("replay-host", help="measure the engine's host time here (vLLM's scheduler, the drafters) "
                                           "as the replay's --calibration fields")
    p.add_argument("--trace", required=True, help="a trace with tokens (trace from-text, from-verl --keep-tokens)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--spec", default="ngram,suffix,group", help="drafters to time (comma-separated)")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    specs = [s.strip() for s in args.spec.split(",") if s.strip()]
    for s in specs:
        DraftSetup(s).check()
    print(json.dumps(measure_host(args.trace, args.max_num_seqs, specs), indent=1))
    return 0

"""``infsample replay``: the command line of the replay (flags, table, JSON, plot)."""

from __future__ import annotations

import json
import sys

from verl_infsample.report import format_table
from .backends import BACKENDS
from .drafts import SPECS
from .hardware import GPUS, MODELS, Calibration

TABLE_COLUMNS = ["backend", "spec", "predictor", "step", "samples", "engine_steps", "lower_bound_steps",
                 "steps_vs_vllm", "model_s", "time_vs_vllm", "tokens_per_step", "drafted_per_step", "propose_s",
                 "preemptions", "recomputed_tokens", "prefix_hit_tokens", "probes", "probe_prefill_tokens",
                 "peak_kv_blocks", "mean_running", "past_found", "past_stray"]


def add_replay_parser(sub) -> None:
    p = sub.add_parser("replay", help="replay a trace's rollouts through vLLM's own scheduler at GPU scale, every "
                                      "backend side by side (steps exact, seconds modeled)")
    p.add_argument("--trace", required=True, help="JSON Lines trace (infsample trace synth --rl, or trace from-verl)")
    p.add_argument("--gpu", default="h200", choices=sorted(GPUS))
    p.add_argument("--model", default="qwen3-8b", choices=sorted(MODELS))
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="verl's rollout default: 0.5")
    p.add_argument("--num-blocks", type=int, help="KV blocks per replica (default: sized as vLLM sizes its pool)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-response-length", type=int,
                   help="rollout.response_length: longer samples are cut there (default: the trace's longest)")
    p.add_argument("--agent-workers", type=int, default=8, help="verl's rollout.agent.num_workers")
    p.add_argument("--backend", action="append",
                   help=f"backends to replay (repeat or comma-separate; default: all of {', '.join(BACKENDS)}, "
                        "transformers aside where --spec drafts)")
    p.add_argument("--predictor", default="history",
                   help="infinite's predictor: history (the product's default) | none | noisy:SIGMA | oracle | "
                        "learned[:k=K] (probes each sample and reads its opening, as the server does; needs a trace "
                        "with openings: trace from-verl)")
    p.add_argument("--probe-tokens", type=int, default=16,
                   help="with noisy:SIGMA or oracle, infinite probes each sample's first K tokens and learns its "
                        "prediction then, as the product's learned predictor does on vLLM (0: predictions at "
                        "submission, no probe)")
    p.add_argument("--router", default="verl", choices=["group_affinity", "verl"],
                   help="infinite's router: verl's own (requests spread by requests in flight; what "
                        "rollout.name=infinite uses on vLLM) or ours (groups whole, by predicted work)")
    p.add_argument("--spec", action="append",
                   help=f"drafts, each backend run with each (repeat or comma-separate; {'|'.join(SPECS)}; default "
                        "off): the product's drafters, verified against the trace's tokens; group_gpu: a device-resident "
                        "group drafter that does not ship (bench/group_match.py), with vLLM's async scheduling kept; "
                        "X_oracle: drafter X's drafts cut to what verification accepts, a bound on its budgets")
    p.add_argument("--spec-tokens", type=int, default=8, help="draft tokens per row at most (custom.speculative_tokens)")
    p.add_argument("--spec-accept", type=float,
                   help="synthetic drafts (a trace without tokens): each draft token accepted with this probability "
                        "until the first rejection; ngram and suffix draft --spec-tokens on every row, group as its "
                        "budget says")
    p.add_argument("--calibration", help="JSON file of the cost model's efficiencies and overheads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="processes replaying replicas side by side")
    p.add_argument("--json", action="store_true", help="one JSON object per backend and step, one per line")
    p.add_argument("--plot", help="write a PNG of running samples per replica over modeled time, per backend")
    p.set_defaults(func=cmd_replay)


def cmd_replay(args) -> int:
    from verl_infsample.report import progress
    from verl_infsample.core.trace import read_trace
    from .runner import ReplayConfig, replay

    specs = tuple(n.strip() for item in (args.spec or ["off"]) for n in item.split(",") if n.strip())
    default = [b for b in BACKENDS if b != "transformers" or specs == ("off",)]  # the transformers engine: no drafts
    backends = tuple(n.strip() for item in (args.backend or [",".join(default)]) for n in item.split(",")
                     if n.strip())
    if args.predictor.partition(":")[0] not in ("history", "none", "noisy", "oracle", "learned"):
        raise ValueError(f"--predictor {args.predictor!r}: the replay's infinite takes history, none, noisy:SIGMA, "
                         "oracle or learned[:k=K,...] (on a trace with openings: trace from-verl)")
    config = ReplayConfig(
        gpu=args.gpu, model=args.model, tp=args.tp, replicas=args.replicas,
        gpu_memory_utilization=args.gpu_memory_utilization, num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size, max_response_length=args.max_response_length,
        agent_workers=args.agent_workers, backends=backends, predictor=args.predictor, router=args.router,
        probe_tokens=args.probe_tokens, seed=args.seed,
        calibration=Calibration.from_file(args.calibration) if args.calibration else Calibration(),
        workers=args.workers, keep_timeline=bool(args.plot),
        specs=specs,
        spec_tokens=args.spec_tokens, spec_accept=args.spec_accept)
    config.check()
    trace = read_trace(args.trace)
    steps = len({p.step for p in trace})
    bar = progress(range(steps * len(backends) * len(config.specs) * args.replicas), "replay (replicas)")
    rows, timelines = replay(trace, config, progress=bar.update)
    bar.close()
    dicts = [r.as_dict() for r in rows]
    _add_ratios(dicts)
    if args.json:
        for d in dicts:
            print(json.dumps(d))
    else:
        print(f"# {config.model} on {config.gpu} x{config.tp}, {config.replicas} replica(s), {config.pool_blocks()} "
              f"KV blocks of {config.block_size} each, max_num_seqs {config.max_num_seqs}: engine steps, "
              "tokens, blocks and preemptions from vLLM's own scheduler (exact); model_s from the step-cost model "
              f"(modeled: {json.dumps(config.calibration.as_dict())})"
              + (f"; drafts synthetic: each token accepted with probability {config.spec_accept}"
                 if config.spec_accept is not None else ""))
        print(format_table(dicts, TABLE_COLUMNS))
    if args.plot:
        from ..bench.plots import plot_running_per_replica

        plot_running_per_replica(timelines, args.plot, title=f"{args.trace}: {config.model} on {config.gpu}, "
                                                             f"{config.replicas} replica(s), last step")
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _add_ratios(rows: list[dict]) -> None:
    """Each row's engine steps and modeled seconds over verl's ``vllm`` with drafts off on the same step (when it
    ran)."""
    base = {r["step"]: r for r in rows if r["backend"] == "vllm" and r["spec"] == "off"}
    for r in rows:
        b = base.get(r["step"])
        r["steps_vs_vllm"] = round(r["engine_steps"] / b["engine_steps"], 4) if b and b["engine_steps"] else None
        r["time_vs_vllm"] = round(r["model_s"] / b["model_s"], 4) if b and b["model_s"] else None

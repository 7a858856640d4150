"""The ``infsample`` command: its parser and the commands of the package, ``trace`` (synth, from-verl, from-text:
make a rollout-length trace), ``simulate`` (a trace through the scheduler's policies, decode steps counted) and
``doctor`` (the set-up checked).

    infsample trace synth --prompts 1 --group-size 32 --max-len 1024 --dist lognormal --seed 0 --out t.jsonl
    infsample simulate --trace t.jsonl --slots 8 [--policy naive --policy infinite] [--predictor noisy:0.3] [--json]
    infsample trace synth --rl --prompts 512 --group-size 16 --max-len 16384 --steps 2 --seed 0 --out rl.jsonl
    infsample trace from-verl DUMP_DIR --tokenizer MODEL_DIR [--keep-tokens] --out run.jsonl
    infsample trace from-text --groups G.jsonl --tokenizer words|MODEL_DIR [--history H] --out T.jsonl
    infsample doctor [--json]

Another installed package adds commands through the ``infsample.commands`` entry points: the lab (``lab/``,
installed by ``make setup``) adds its replay, benchmarks, evaluations and tiny model.

Bad input (a malformed trace line, M < 1, a budget that fits no sample, an unknown policy) prints one clear error
and exits with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from .core.capacity import KVBudget, SlotPool
from .core.policies import POLICIES
from .report import format_table, progress
from .core.trace import DISTRIBUTIONS, TraceError, read_trace, synth_rl_trace, synth_trace, write_trace


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (TraceError, ValueError) as e:
        print(f"infsample: error: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infsample", description="Infinite Sampling for verl: traces and simulation.")
    sub = p.add_subparsers(dest="command", required=True)

    trace = sub.add_parser("trace", help="make or inspect rollout-length traces").add_subparsers(
        dest="trace_command", required=True)
    synth = trace.add_parser("synth", help="draw a synthetic trace (JSON Lines, one prompt per line)")
    synth.add_argument("--prompts", type=int, required=True)
    synth.add_argument("--group-size", type=int, required=True, help="G: responses per prompt")
    synth.add_argument("--max-len", type=int, required=True, help="response length cap (tokens)")
    synth.add_argument("--dist", choices=DISTRIBUTIONS, default="lognormal")
    synth.add_argument("--rl", action="store_true",
                       help="shaped like reasoning RL: per-prompt difficulty kept across --steps, spread within a "
                            "group, a mass at the cap, lengths growing over training (--dist is ignored)")
    synth.add_argument("--steps", type=int, default=1, help="with --rl: training steps, each revisiting every prompt")
    synth.add_argument("--median", type=float, default=1500.0, help="with --rl: the median response length")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--out", required=True)
    synth.set_defaults(func=_cmd_synth)

    from_verl = trace.add_parser("from-verl", help="a trace from verl's rollout dumps (trainer.rollout_data_dir)")
    from_verl.add_argument("dump_dir", help="the folder verl wrote {step}.jsonl files into")
    from_verl.add_argument("--tokenizer", required=True, help="the run's model or tokenizer folder (lengths in tokens)")
    from_verl.add_argument("--keep-tokens", action="store_true",
                           help="keep every sample's whole response (the replay verifies drafts against it)")
    from_verl.add_argument("--out", required=True)
    from_verl.set_defaults(func=_cmd_from_verl)

    from_text = trace.add_parser("from-text", help="a trace from multi-sample text (JSON Lines: prompt_id, prompt, "
                                                   "responses), its tokens kept")
    from_text.add_argument("--groups", required=True, help='one prompt a line: {"prompt_id", "prompt", "responses"}')
    from_text.add_argument("--tokenizer", default="words", help="words (whitespace words) or a model folder")
    from_text.add_argument("--history", type=int, default=0,
                           help="the first H responses of each prompt are an earlier step's (step 0), the rest step 1")
    from_text.add_argument("--out", required=True)
    from_text.set_defaults(func=_cmd_from_text)

    sim = sub.add_parser("simulate", help="replay a trace through the scheduler policies, counting decode steps")
    sim.add_argument("--trace", required=True)
    cap = sim.add_mutually_exclusive_group(required=True)
    cap.add_argument("--slots", type=int, help="M: samples decoded at once (the paper's memory model)")
    cap.add_argument("--kv-budget", type=int, help="KV cache budget in tokens (prompt once per group + generated)")
    sim.add_argument("--policy", action="append",
                     help=f"policy to run (repeat or comma-separate; default: all of {', '.join(POLICIES)})")
    sim.add_argument("--predictor", default="noisy:0.3", help="oracle | noisy:SIGMA | none | history | learned[:k=K]")
    sim.add_argument("--max-len", type=int, help="response length cap (default: the trace's longest sample)")
    sim.add_argument("--fptas-eps", type=float, default=0.02, help="the global plan's (1+eps) guarantee")
    sim.add_argument("--prefill-chunk", type=int, default=2048,
                     help="tokens one forward pass prefills: what rebuilding a preempted sample's KV costs in steps")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", action="store_true", help="print one JSON list, one object per policy")
    sim.add_argument("--plot", help="write a PNG of KV tokens in use over decode steps, per policy")
    sim.set_defaults(func=_cmd_simulate)

    doctor = sub.add_parser("doctor", help="check the set-up before a long job: versions, the plugin's entry point, "
                                           "vLLM and its APIs, the patches, GPUs; exit 1 naming each fault and its fix")
    doctor.add_argument("--json", action="store_true", help="one JSON object")
    doctor.set_defaults(func=_cmd_doctor)

    for command in _plugged_in_commands():
        command.load()(sub)
    return p


COMMANDS_GROUP = "infsample.commands"


def _plugged_in_commands():
    """Commands another installed package adds (entry points in ``infsample.commands``, each a function that adds
    its subparser): the lab's replay, benchmarks and tiny models, where it is installed (``make setup``)."""
    from importlib.metadata import entry_points

    return sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name)


def _cmd_doctor(args) -> int:
    from .doctor import diagnose, format_report

    report = diagnose()
    print(json.dumps(report.as_dict()) if args.json else format_report(report))
    return 0 if report.ok else 1


def _cmd_synth(args) -> int:
    if args.rl:
        prompts = synth_rl_trace(args.prompts, args.group_size, args.max_len, args.steps, args.seed, args.median)
    else:
        prompts = synth_trace(args.prompts, args.group_size, args.max_len, args.dist, args.seed)
    write_trace(prompts, args.out)
    n = sum(p.group_size for p in prompts)
    print(f"wrote {args.out}: {len(prompts)} prompts, {n} samples, {sum(sum(p.lengths) for p in prompts)} tokens",
          file=sys.stderr)
    return 0


def _cmd_from_verl(args) -> int:
    from .integration.rollout_dumps import trace_from_verl

    prompts = trace_from_verl(args.dump_dir, args.tokenizer, keep_tokens=args.keep_tokens)
    write_trace(prompts, args.out)
    print(f"wrote {args.out}: {len({p.step for p in prompts})} steps, {len(prompts)} groups, "
          f"{sum(p.group_size for p in prompts)} samples", file=sys.stderr)
    return 0


def _cmd_from_text(args) -> int:
    from .core.text_groups import load_groups, make_tokenizer, trace_from_groups

    prompts = trace_from_groups(load_groups(args.groups, make_tokenizer(args.tokenizer)), args.history)
    write_trace(prompts, args.out)
    print(f"wrote {args.out}: {len({p.step for p in prompts})} steps, {len(prompts)} groups, "
          f"{sum(p.group_size for p in prompts)} samples, {sum(sum(p.lengths) for p in prompts)} tokens",
          file=sys.stderr)
    return 0


def _policies(raw: list[str] | None) -> list[str]:
    names = [n.strip() for item in (raw or [",".join(POLICIES)]) for n in item.split(",") if n.strip()]
    for n in names:
        if n not in POLICIES:
            raise ValueError(f"unknown --policy {n!r}; choose from: {', '.join(POLICIES)}")
    return names


def _cmd_simulate(args) -> int:
    from .engines.simulated import simulate  # keeps `infsample trace` light

    policies = _policies(args.policy)
    capacity = SlotPool(args.slots) if args.slots is not None else KVBudget(args.kv_budget)
    trace = read_trace(args.trace)
    results, timelines = [], {}
    for name in progress(policies, "simulate"):
        res, sched = simulate(trace, name, capacity, args.predictor, max_len=args.max_len, seed=args.seed,
                              fptas_eps=args.fptas_eps, prefill_chunk=args.prefill_chunk,
                              return_scheduler=True)
        results.append(res)
        timelines[name] = sched.stats.kv_timeline
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=1))
    else:
        print(format_table([r.as_dict() for r in results],
                           ["policy", "predictor", "decode_steps", "lower_bound_steps", "steps_vs_bound",
                            "peak_active", "peak_kv_tokens", "preemptions", "recompute_tokens", "plan_ms",
                            "total_tokens"]))
    if args.plot:
        from .report import plot_kv_timelines

        plot_kv_timelines(timelines, args.plot, title=f"{args.trace} under {capacity}", unit="KV tokens")
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

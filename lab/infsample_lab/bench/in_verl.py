"""``infsample bench-verl``: ``rollout.name=infinite`` against verl's own ``rollout.name=vllm``, inside verl.

For each ``rollout.n`` it runs verl's trainer (``python -m verl.trainer.main_ppo`` through
``examples/logic_puzzles/run_grpo_cpu.sh``: real Ray, FSDP workers, agent loop, vLLM) twice, on the same tiny model,
puzzles, seed, ``max_num_seqs`` and vLLM KV pool (``num_gpu_blocks_override``): once with verl's vLLM rollout, once
with ours on vLLM. Both servers report the same figures, from vLLM's own per-step stats (``vllm_stats``; verl's is
instrumented through ``VERL_INFSAMPLE_VLLM_STATS=1``), read after each training step by the ``infinite_sync``
trainer mode: ``gen_s`` is the engine's own wall time for the step's rollout (first to last engine step), not verl's
``timing_s/gen``, which also counts the agent loop and comes in whole seconds on a busy CPU. Requests are seeded by
prompt and arrival rank on both backends (``request_seeds``), so both decode the same samples and their engine
steps differ by schedule, not by chance. Not by the schedule alone, though: verl's agent loop sends a step's requests
at the pace the CPU allows, and what has reached vLLM when it schedules moves one run's engine steps by 10% and
more. ``--repeats R`` runs each pair R times, the backends alternating, and reports each run's figures against the
verl run beside it and, per backend and ``n``, their median and range (``repeat_summary``).

``--workload varying``: the tiny ``modes`` model on chain arithmetic (``examples/chains``), which answers each
prompt at random in one of three modes whose first token announces the answer's length (about 10 to 150 tokens),
so lengths vary within every group and can be told from the opening. ``infinite`` runs the ``learned`` predictor:
each sample is probed (its first token) and its rest runs at its own prediction's place. A probe and its rest
cannot share a request seed, so both backends run unseeded there, and their samples differ by chance.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verl_infsample.report import format_table, progress

from ..paths import REPO

ROOT = REPO
SCRIPT = ROOT / "examples" / "logic_puzzles" / "run_grpo_cpu.sh"
BACKENDS = ("vllm", "infinite")
# a backend with drafts: "vllm+suffix" is verl's vLLM rollout with vLLM's suffix drafts, as a verl user turns them on
# (engine_kwargs.vllm.speculative_config); "infinite+group" is ours with custom.speculative=group
VARIANTS = (*BACKENDS, *(f"{b}+{s}" for b in BACKENDS for s in ("ngram", "suffix", "group")))


@dataclass(frozen=True)
class Workload:
    """What the runs train on: the example script, the tiny model variant, and what ``infinite`` adds."""

    script: Path
    variant: str
    seeded: bool  # requests seeded by prompt and arrival rank on both backends (``request_seeds``)
    infinite_overrides: tuple[str, ...] = ()


WORKLOADS = {
    "puzzles": Workload(SCRIPT, "default", seeded=True),
    "varying": Workload(ROOT / "examples" / "chains" / "run_grpo_cpu.sh", "modes", seeded=False,
                        infinite_overrides=("actor_rollout_ref.rollout.custom.predictor='learned:k=1'",)),
}
COLUMNS = ["backend", "n", "prompts", "samples", "gen_s", "engine_steps", "lower_bound_steps", "preemptions",
           "tokens_computed", "generated_tokens", "peak_kv_blocks", "kv_blocks", "gen_s_vs_vllm", "steps_vs_vllm",
           "steps_vs_lower_bound", "steps_vs_arrival_bound", "tokens_per_step", "drafter_ms_per_step"]


@dataclass
class VerlBenchRow:
    backend: str  # vllm: verl's vLLM rollout; infinite: ours, on vLLM
    n: int  # rollout.n
    prompts: int  # per step
    samples: int  # finished in the measured steps
    gen_s: float  # engine wall time of the steps' rollouts, summed
    engine_steps: int
    preemptions: int
    tokens_computed: int  # prefilled (not from the prefix cache) + generated
    generated_tokens: int
    cached_prompt_tokens: int
    peak_kv_blocks: int
    kv_blocks: int
    kv_block_size: int
    verl_gen_s: float  # verl's own timing_s/gen, for reference
    # per step max(longest response, ceil(generated tokens / max_num_seqs)), summed: no schedule takes fewer steps
    # (where the backends' samples differ, unseeded, this is what they compare by)
    lower_bound_steps: int = 0
    steps_vs_lower_bound: float | None = None
    # the same with each sample in no step before it reached vLLM (infsample/arrival_bound_steps): what the pace at
    # which verl's agent loop sends a step's requests leaves to any order
    arrival_bound_steps: int = 0
    steps_vs_arrival_bound: float | None = None
    gen_s_vs_vllm: float | None = None  # this row's gen_s / verl vLLM's at the same n
    steps_vs_vllm: float | None = None
    # per training step (where a predictor that learns shows when it has learnt): engine steps and lower bound
    step_engine_steps: list[int] = field(default_factory=list)
    step_lower_bound_steps: list[int] = field(default_factory=list)
    step_arrival_bound_steps: list[int] = field(default_factory=list)
    # rows vLLM ran a step, over the run (max_num_seqs at most): below it, slots stood idle or KV ran short
    mean_running: float | None = None
    plan_ms: float = 0.0  # the server's time in the plan's order (infinite on vLLM), over the run
    tokens_per_step: float | None = None  # tokens a running row gained per engine step (1 + accepted drafts)
    spec_drafted: int = 0  # draft tokens verified, and accepted (vLLM's scheduler counts them)
    spec_accepted: int = 0
    drafter_ms_per_step: float | None = None  # the group drafter's own time per engine step (infinite+group)
    repeat: int = 0  # which of ``--repeats`` runs of this backend and n; ratios are against verl's of the same one


SUMMARY_COLUMNS = ["backend", "n", "runs", "engine_steps", "steps_min", "steps_max", "steps_vs_vllm",
                   "steps_vs_vllm_min", "steps_vs_vllm_max", "gen_s_vs_vllm", "steps_vs_lower_bound"]


@dataclass
class VerlBenchSummary:
    """One backend at one n over ``--repeats`` runs: medians, and the range of what one run shows."""

    backend: str
    n: int
    runs: int
    engine_steps: float  # median
    steps_min: int
    steps_max: int
    steps_vs_vllm: float | None  # median of the runs' ratios to the verl run beside each
    steps_vs_vllm_min: float | None
    steps_vs_vllm_max: float | None
    gen_s_vs_vllm: float | None  # median
    steps_vs_lower_bound: float | None  # median


def add_bench_verl_parser(sub) -> None:
    p = sub.add_parser("bench-verl", help="verl's trainer with rollout.name=vllm and with rollout.name=infinite "
                                          "(vLLM), side by side")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="puzzles",
                   help="puzzles: knights and knaves, the default tiny model, seeded requests; varying: the modes "
                        "model on chain arithmetic, lengths told by the opening, infinite with the learned predictor")
    p.add_argument("--n", type=int, action="append", help="rollout.n values (repeat; default: 16, 64, 256)")
    p.add_argument("--samples", type=int, default=128,
                   help="samples per step: prompts per step = max(1, samples // n) (default 128)")
    p.add_argument("--steps", type=int, default=1, help="training steps per run (each one's rollout is measured)")
    p.add_argument("--slots", type=int, default=16, help="max_num_seqs of both (samples decoded at once)")
    p.add_argument("--kv-blocks", type=int, default=24,
                   help="vLLM KV pool of both, in blocks (num_gpu_blocks_override; default 24: on the CPU, blocks "
                        "of 128 tokens, a few prompts and max_num_seqs samples)")
    p.add_argument("--response-length", type=int, help="default: 48 (puzzles), 160 (varying)")
    p.add_argument("--backend", action="append", choices=VARIANTS,
                   help="backends (default: vllm and infinite); with drafts: vllm+suffix (verl's vLLM rollout with "
                        "vLLM's suffix drafts through engine_kwargs), infinite+group (custom.speculative=group), ...")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each backend and n, alternating (a run's engine steps move with the agent loop's "
                        "pace: compare medians)")
    p.add_argument("--unseeded", dest="seeded", action="store_false",
                   help="leave requests unseeded (by default each gets a seed of its prompt and arrival rank, on "
                        "both backends, so both draw the same tokens: request_seeds)")
    p.add_argument("--extra", action="append", default=[],
                   help="a Hydra override for every run (repeat), e.g. actor_rollout_ref.rollout.custom.policy=plain")
    p.add_argument("--json", action="store_true", help="print one JSON list, one object per run")
    p.add_argument("--plot", help="write a PNG of gen_s and engine steps per n")
    p.add_argument("--log-dir", help="keep each run's output here (default: a temporary folder, removed)")
    p.set_defaults(func=_cmd_bench_verl)


def parse_step_lines(output: str) -> dict[int, dict[str, float]]:
    """verl's console logger prints ``step:K - key:value - key:value ...`` once per step."""
    steps = {}
    for line in output.splitlines():
        m = re.search(r"\bstep:(\d+) - (.*)$", line)
        if not m:
            continue
        metrics = {}
        for item in m.group(2).split(" - "):
            key, _, value = item.partition(":")
            num = re.fullmatch(r"\s*(?:np\.\w+\()?(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\)?\s*", value)
            if num:  # 0.5, 1e-05, np.int32(2), np.float64(2.0); nan/inf/strings are left out
                metrics[key.strip()] = float(num.group(1))
        steps[int(m.group(1))] = metrics
    return steps


def draft_overrides(variant: str) -> list[str]:
    """The Hydra overrides that turn a variant's drafts on: verl's way for vllm, ours for infinite."""
    from verl_infsample.integration.settings import InfiniteRolloutSettings

    backend, _, spec = variant.partition("+")
    if not spec:
        return []
    if backend == "infinite":
        return [f"actor_rollout_ref.rollout.custom.speculative={spec}"]
    config = InfiniteRolloutSettings(speculative=spec).speculative_config()
    return ["+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config={"
            + ",".join(f"{k}:{v}" for k, v in config.items()) + "}"]


def run_one(variant: str, n: int, prompts: int, args, work: Path, repeat: int = 0) -> VerlBenchRow:
    """One training run; raises with the run's last output if it fails or reports no figures."""
    from ..models.tiny import tiny_model_path

    backend = variant.partition("+")[0]
    workload = WORKLOADS[args.workload]
    response_length = args.response_length or (160 if args.workload == "varying" else 48)
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_PLUGINS", "RAY_ADDRESS")}
    env.update(PYTHON=sys.executable, STEPS=str(args.steps), N=str(n), BATCH=str(prompts), NGPUS="1",
               SLOTS=str(args.slots), RESPONSE_LEN=str(response_length), ROLLOUT=backend, ENGINE="vllm",
               MODEL_PATH=str(tiny_model_path(variant=workload.variant)), VERL_INFSAMPLE_VLLM_STATS="1",
               VERL_INFSAMPLE_REQUEST_SEEDS="1" if args.seeded and workload.seeded else "0")
    overrides = ["trainer.v1.trainer_mode=infinite_sync",  # collects the servers' figures after each step
                 f"+actor_rollout_ref.rollout.engine_kwargs.vllm.num_gpu_blocks_override={args.kv_blocks}",
                 "actor_rollout_ref.actor.use_kl_loss=false",
                 *(workload.infinite_overrides if backend == "infinite" else ()), *draft_overrides(variant),
                 *args.extra]
    name = f"{variant.replace('+', '_')}_n{n}" + (f"_r{repeat}" if repeat else "")
    proc = subprocess.run(["bash", str(workload.script), str(work / name), *overrides], capture_output=True,
                          text=True, env=env, cwd=work, timeout=1800)
    output = proc.stdout + proc.stderr
    log = work / f"{name}.log"
    log.write_text(output)
    steps = parse_step_lines(output)
    if proc.returncode != 0 or sorted(steps) != list(range(1, args.steps + 1)) or not all(
            "infsample/decode_steps" in m for m in steps.values()):
        raise RuntimeError(f"bench-verl: the {variant} run at n={n} failed (rc {proc.returncode}); its log: "
                           f"{log}\n{output[-3000:]}")
    row = row_from_steps(variant, n, prompts, args.slots, steps)
    row.repeat = repeat
    return row


def step_lower_bound(metrics: dict[str, float], slots: int) -> int:
    """No schedule of a step takes fewer engine steps than its longest response, nor than its generated tokens over
    the samples decoded at once."""
    return int(max(metrics.get("response_length/max", 0.0), -(-metrics.get("infsample/total_tokens", 0.0) // slots)))


def row_from_steps(backend: str, n: int, prompts: int, slots: int, steps: dict[int, dict[str, float]]
                   ) -> VerlBenchRow:
    """One run's row from verl's console metrics of its training steps (``parse_step_lines``)."""
    ordered = [steps[k] for k in sorted(steps)]
    bounds = [step_lower_bound(m, slots) for m in ordered]
    lower_bound = sum(bounds)
    arrival_bounds = [max(b, int(m.get("infsample/arrival_bound_steps", 0.0))) for b, m in zip(bounds, ordered)]
    arrival_bound = sum(arrival_bounds)

    def total(key: str) -> float:
        return sum(m.get(f"infsample/{key}", 0.0) for m in ordered)

    def peak(key: str) -> int:
        return int(max((m.get(f"infsample/{key}", 0.0) for m in ordered), default=0))

    return VerlBenchRow(backend=backend, n=n, prompts=prompts, samples=int(total("samples")),
                        gen_s=round(total("wall_s"), 3), engine_steps=int(total("decode_steps")),
                        preemptions=int(total("preemptions")), tokens_computed=int(total("tokens_computed")),
                        generated_tokens=int(total("total_tokens")),
                        cached_prompt_tokens=int(total("cached_prompt_tokens")),
                        peak_kv_blocks=peak("peak_kv_blocks"), kv_blocks=peak("kv_blocks"),
                        kv_block_size=peak("kv_block_size"),
                        verl_gen_s=round(sum(m.get("timing_s/gen", 0.0) for m in ordered), 2),
                        lower_bound_steps=lower_bound,
                        steps_vs_lower_bound=round(total("decode_steps") / lower_bound, 3) if lower_bound else None,
                        step_engine_steps=[int(m.get("infsample/decode_steps", 0.0)) for m in ordered],
                        step_lower_bound_steps=bounds,
                        arrival_bound_steps=arrival_bound,
                        steps_vs_arrival_bound=round(total("decode_steps") / arrival_bound, 3)
                        if arrival_bound else None,
                        step_arrival_bound_steps=arrival_bounds,
                        mean_running=round(total("running_rows") / total("decode_steps"), 2)
                        if total("decode_steps") and total("running_rows") else None,
                        plan_ms=round(total("plan_ms"), 1),
                        tokens_per_step=round(total("total_tokens") / total("running_rows"), 3)
                        if total("running_rows") else None,
                        spec_drafted=int(total("spec_drafted")), spec_accepted=int(total("spec_accepted")),
                        drafter_ms_per_step=round(statistics.mean(m["infsample/spec_drafter_ms_per_step"] for m in
                                                                  ordered), 3)
                        if all("infsample/spec_drafter_ms_per_step" in m for m in ordered) else None)


def with_ratios(rows: list[VerlBenchRow]) -> list[VerlBenchRow]:
    """Each row's gen_s and engine steps relative to verl's vLLM rollout at the same n and repeat."""
    base = {(r.n, r.repeat): r for r in rows if r.backend == "vllm"}
    for r in rows:
        b = base.get((r.n, r.repeat))
        if b is not None and b.gen_s > 0 and b.engine_steps > 0:
            r.gen_s_vs_vllm = round(r.gen_s / b.gen_s, 3)
            r.steps_vs_vllm = round(r.engine_steps / b.engine_steps, 3)
    return rows


def repeat_summary(rows: list[VerlBenchRow]) -> list[VerlBenchSummary]:
    """Per backend and n (in the rows' order): the median of its runs and the range one run shows."""
    def median(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    groups: dict[tuple[str, int], list[VerlBenchRow]] = {}
    for r in rows:
        groups.setdefault((r.backend, r.n), []).append(r)
    out = []
    for (backend, n), runs in groups.items():
        ratios = [r.steps_vs_vllm for r in runs if r.steps_vs_vllm is not None]
        out.append(VerlBenchSummary(
            backend=backend, n=n, runs=len(runs), engine_steps=median(r.engine_steps for r in runs),
            steps_min=min(r.engine_steps for r in runs), steps_max=max(r.engine_steps for r in runs),
            steps_vs_vllm=median(ratios), steps_vs_vllm_min=min(ratios, default=None),
            steps_vs_vllm_max=max(ratios, default=None), gen_s_vs_vllm=median(r.gen_s_vs_vllm for r in runs),
            steps_vs_lower_bound=median(r.steps_vs_lower_bound for r in runs)))
    return out


def _cmd_bench_verl(args) -> int:
    ns = args.n or [16, 64, 256]
    backends = list(dict.fromkeys(args.backend or BACKENDS))
    if any(n < 1 for n in ns) or min(args.steps, args.slots, args.kv_blocks, args.repeats) < 1:
        raise ValueError("--n, --steps, --slots, --kv-blocks and --repeats must be >= 1")
    runs = [(b, n, k) for k in range(args.repeats) for n in ns for b in backends]
    rows = []
    with tempfile.TemporaryDirectory(prefix="infsample_bench_verl_") as tmp:
        work = Path(args.log_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for backend, n, repeat in progress(runs, "bench-verl"):
            prompts = max(1, args.samples // n)
            print(f"bench-verl: {backend} n={n} x {prompts} prompt(s)"
                  + (f", run {repeat + 1} of {args.repeats}" if args.repeats > 1 else "") + " ...",
                  file=sys.stderr, flush=True)
            rows.append(run_one(backend, n, prompts, args, work, repeat))
        print(f"bench-verl: {len(runs)} runs in {time.monotonic() - started:.0f} s", file=sys.stderr)
    rows = with_ratios(rows)
    summary = repeat_summary(rows) if args.repeats > 1 else []
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(format_table([asdict(r) for r in rows], ["repeat", *COLUMNS] if summary else COLUMNS))
    if summary:  # on stderr under --json, whose stdout stays one JSON list of the runs
        print("\n" + format_table([asdict(s) for s in summary], SUMMARY_COLUMNS), file=sys.stderr if args.json
              else sys.stdout)
    if args.plot:
        from .plots import plot_bench_verl

        plot_bench_verl([asdict(r) for r in rows], args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0

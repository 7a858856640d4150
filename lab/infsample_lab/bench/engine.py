"""``infsample bench-engine``: the policies on the real engine, next to what a user would do without us.

One run, same model, prompts and sampling for every row: our policies on ``TransformersEngine`` (``full`` first, as
the reference every other policy's tokens are compared against; ``oracle`` gets the true lengths ``full`` found), then
``hf-full`` (``generate`` with ``num_return_sequences=G``) and ``hf-micro`` (G/M sequential ``generate`` calls of M).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from verl_infsample.report import format_table, progress
from verl_infsample.core.capacity import KVBudget, SlotPool
from verl_infsample.core.policies import POLICIES
from verl_infsample.predict import make_predictor

HF_POLICIES = ("hf-full", "hf-micro")
WARMED = {"history": 1, "learned": 3, "none": 0}  # default earlier rollouts each predictor learns from first


@dataclass
class EngineBenchRow:
    policy: str
    decode_steps: int
    peak_kv_bytes: int
    wall_s: float
    tokens_per_s: float
    total_tokens: int
    identical_to_full: bool
    sched_overhead: float | None  # share of wall time in the scheduler: its plan and its bookkeeping (None for hf-*)
    step_overhead: float | None  # the scheduler's bookkeeping per decode step / the engine's time per step (no plan)
    prefill_passes: int | None
    preemptions: int | None


def add_bench_engine_parser(sub) -> None:
    p = sub.add_parser("bench-engine", help="run the policies on the real (transformers) engine and compare")
    p.add_argument("--model", help="HF checkpoint folder (default: the project's tiny model, built on first use)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=64, help="G")
    p.add_argument("--slots", type=int, default=8, help="M")
    p.add_argument("--kv-budget", type=int, help="run our policies under a KV budget (tokens) instead of M slots")
    p.add_argument("--kv-share", type=float,
                   help="instead of --kv-budget: a budget of this share of full's measured peak KV, in whole blocks "
                        "(the M=8 goal's 20%%: 0.2); full runs first and sets it")
    p.add_argument("--max-running", type=int,
                   help="with --kv-budget or --kv-share: also cap the samples decoding at once (as vLLM's "
                        "max_num_seqs does)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--policy", action="append", help="policies (repeat or comma-separate; default: all ours + hf-*)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--predictor", default="history",
                   help="length predictor of lpt/infinite: history, none or learned[:k=K,...] (default: history)")
    p.add_argument("--warm-rollouts", type=int,
                   help="earlier rollouts at other seeds the predictor learns from first, as from GRPO's earlier "
                        "steps (default: 1 for history, 3 for learned, 0 for none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads, the same for every row (default 1: a tiny model on CPU runs fastest on one)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of every policy; each row keeps its fastest (wall times on a shared machine are noisy; "
                        "steps, tokens and bytes are the same in every round)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", help="PNG of KV bytes in use over decode steps, per policy")
    p.set_defaults(func=cmd_bench_engine)


def cmd_bench_engine(args) -> int:
    names = [n.strip() for item in (args.policy or [",".join([*POLICIES, *HF_POLICIES])])
             for n in item.split(",") if n.strip()]
    for n in names:
        if n not in POLICIES and n not in HF_POLICIES:
            raise ValueError(f"unknown --policy {n!r}; choose from: {', '.join([*POLICIES, *HF_POLICIES])}")
    if args.slots < 1:
        raise ValueError(f"--slots (M) must be >= 1, got {args.slots}")
    if args.predictor.partition(":")[0] not in WARMED:
        raise ValueError(f"--predictor {args.predictor!r}: bench-engine runs history, none or learned[:k=K,...] "
                         "(oracle is its own policy; noisy needs true lengths: use infsample simulate)")
    if args.warm_rollouts is not None and args.warm_rollouts < 0:
        raise ValueError(f"--warm-rollouts must be >= 0, got {args.warm_rollouts}")
    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    if args.kv_share is not None and (args.kv_budget is not None or not 0 < args.kv_share <= 1):
        raise ValueError(f"--kv-share {args.kv_share}: give a share in (0, 1] of full's peak KV, and not with "
                         "--kv-budget (which gives the budget in tokens)")
    if args.max_running is not None and ((args.kv_budget is None and args.kv_share is None) or args.max_running < 1):
        raise ValueError(f"--max-running {args.max_running}: give it with --kv-budget or --kv-share, and at least 1 "
                         "(without a budget --slots caps the samples decoding at once)")
    rows, timelines = run_engine_bench(
        model_dir=args.model, prompts=args.prompts, group_size=args.group_size, slots=args.slots,
        kv_budget=args.kv_budget, kv_share=args.kv_share, max_running=args.max_running,
        max_new_tokens=args.max_new_tokens, policies=names, seed=args.seed,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, threads=args.threads,
        predictor=args.predictor, warm_rollouts=args.warm_rollouts, repeat=args.repeat)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(format_table([asdict(r) for r in rows], list(EngineBenchRow.__dataclass_fields__)))
    if args.plot:
        from verl_infsample.report import plot_kv_timelines

        plot_kv_timelines(timelines, args.plot, unit="KV bytes in use",
                          title=f"{args.prompts} prompt(s) x G={args.group_size}, M={args.slots}, "
                                f"{args.max_new_tokens} new tokens")
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def bench_workload(*, model_dir=None, prompts=4, seed=0, temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=128):
    """The benchmark's engine, prompts (token ids, chat template applied) and sampling at ``seed``, and the tokenizer:
    what every row runs on."""
    from transformers import AutoTokenizer

    from verl_infsample.engines.sampling import SamplingParams
    from verl_infsample.engines.transformers_engine import TransformersEngine
    from ..models.tiny import default_prompts, tiny_model_path

    model_dir = str(model_dir or tiny_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = default_prompts(prompts, seed=10_000 + seed)
    prompt_ids = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False) for t in texts]
    stop = tuple(sorted({tokenizer.eos_token_id, *([tokenizer.pad_token_id] if tokenizer.pad_token_id is not None
                                                     else [])}))
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                            stop_token_ids=stop, seed=seed)
    return TransformersEngine.from_pretrained(model_dir), prompt_ids, params, tokenizer


def earlier_params(params, rollout: int):
    """Sampling for the ``rollout``-th earlier rollout that warms a predictor: another seed, so nothing of this run's
    lengths leaks into it (GRPO's earlier steps over the same prompts)."""
    from verl_infsample.engines.sampling import SamplingParams

    return SamplingParams(**{**params.__dict__, "seed": params.seed + 1_000_003 + rollout})


def recorded_lengths(seed: int, prompts: int = 4, group_size: int = 64, max_new_tokens: int = 128,
                     model_dir=None) -> dict:
    """The bench's prompt lengths and, per prompt, the response lengths the model generates at ``seed`` (``this``)
    and at the earlier rollout that warms ``history`` (``warm``): the workload's lengths, for replaying it in the
    simulator (``scripts/bench_seed_sweep.py``, ``scripts/bench_plan.py``)."""
    engine, prompt_ids, params, _ = bench_workload(model_dir=model_dir, prompts=prompts, seed=seed,
                                                   max_new_tokens=max_new_tokens)
    full = SlotPool(group_size)
    runs = {tag: engine.rollout(prompt_ids, group_size, p, policy="full", capacity=full)
            for tag, p in (("this", params), ("warm", earlier_params(params, 0)))}
    return {"prompt_lens": [len(p) for p in prompt_ids],
            **{tag: [[len(o.token_ids) for o in g] for g in run.outputs] for tag, run in runs.items()}}


def recorded_trace(rec: dict) -> list:
    """The lengths of ``recorded_lengths`` at the bench's seed as a simulator trace (one ``TracePrompt`` per prompt)."""
    from verl_infsample.core.trace import TracePrompt

    return [TracePrompt(str(i), n, lengths) for i, (n, lengths) in enumerate(zip(rec["prompt_lens"], rec["this"]))]


def warm_on_recorded(predictor, rec: dict):
    """``predictor`` after it has seen the warming rollout of ``recorded_lengths`` (what ``bench-engine`` warms it
    with), returned for chaining."""
    from verl_infsample.core.sample import Group

    for i, lengths in enumerate(rec["warm"]):
        for n in lengths:
            predictor.observe(Group(str(i), rec["prompt_lens"][i], len(lengths)), None, n)
    return predictor


def run_engine_bench(*, model_dir=None, prompts=4, group_size=64, slots=8, kv_budget=None, max_running=None,
                     max_new_tokens=128, policies=("full", "naive", "continuous", "infinite", "hf-micro"), seed=0,
                     temperature=1.0, top_p=1.0, top_k=-1, threads=None, predictor="history", warm_rollouts=None,
                     repeat=1, kv_share=None):
    """``kv_share``: instead of ``kv_budget``, a budget of that share of ``full``'s measured peak KV in whole blocks
    (``full`` runs first, before the predictor's warming rollouts, and is the first round's ``full``)."""
    import copy

    import torch

    from ..bench.hf_baseline import hf_generate

    if threads:
        torch.set_num_threads(threads)
    engine, prompt_ids, params, tokenizer = bench_workload(
        model_dir=model_dir, prompts=prompts, seed=seed, temperature=temperature, top_p=top_p, top_k=top_k,
        max_new_tokens=max_new_tokens)
    first_full = None
    if kv_share is not None:
        first_full = engine.rollout(prompt_ids, group_size, params, policy="full", capacity=SlotPool(group_size))
        blocks = int(kv_share * first_full.kv.peak_in_use_bytes // engine.pool.bytes_per_block)
        kv_budget = blocks * engine.pool.block_size
        print(f"bench-engine: --kv-share {kv_share:g} of full's peak ({first_full.kv.peak_in_use_bytes} bytes): a "
              f"{kv_budget}-token KV budget", file=sys.stderr)
        try:
            KVBudget(max(kv_budget, 1), engine.pool.block_size).check_fits(max(map(len, prompt_ids)), max_new_tokens)
        except ValueError as e:
            raise ValueError(f"--kv-share {kv_share:g}: {e}; raise --kv-share") from None
    capacity = KVBudget(kv_budget, max_running=max_running) if kv_budget else SlotPool(slots)
    ours = [p for p in policies if p in POLICIES]
    warm = make_predictor(predictor, max_len=max_new_tokens)
    if warm_rollouts is None:
        warm_rollouts = WARMED.get(predictor.partition(":")[0], 0)
    for w in range(warm_rollouts):
        engine.rollout(prompt_ids, group_size, earlier_params(params, w), policy="infinite", capacity=capacity,
                       predictor=warm)
    order = ["full"] + [p for p in ours if p != "full"]  # full always runs first: the reference tokens
    hf = [p for p in policies if p in HF_POLICIES]
    runs: dict[str, list] = {name: [] for name in [*order, *hf]}
    reference, true_lengths = None, None
    # every policy once per round, rounds back to back: a noisy machine's slow spell hits them alike, and each row
    # keeps its fastest round (decode steps, tokens and bytes are the same in every round of ours)
    rounds = [(r, name) for r in range(repeat) for name in [*order, *hf] if r == 0 or name != "full" or "full" in ours]
    for _, name in progress(rounds, "bench-engine"):
        if name in HF_POLICIES:
            runs[name].append(hf_generate(engine.model, prompt_ids, group_size, params,
                                          micro=None if name == "hf-full" else slots,
                                          pad_token_id=tokenizer.pad_token_id or 0))
            continue
        cap = SlotPool(group_size) if name == "full" else capacity
        if name == "full" and first_full is not None:  # (the run that set the budget)
            res, first_full = first_full, None
        else:
            res = engine.rollout(prompt_ids, group_size, params, policy=name, capacity=cap,
                                 predictor=copy.deepcopy(warm), true_lengths=true_lengths if name == "oracle" else None)
        tokens = [[o.token_ids for o in g] for g in res.outputs]
        if reference is None:  # (full, first round)
            reference, true_lengths = tokens, [[len(t) for t in g] for g in tokens]
        runs[name].append((res, tokens == reference))
    rows, timelines = [], {}
    for name in [p for p in order if p in ours]:
        res, _ = min(runs[name], key=lambda run: run[0].wall_s)
        rows.append(EngineBenchRow(
            policy=name, decode_steps=res.stats.decode_steps, peak_kv_bytes=res.kv.peak_in_use_bytes,
            wall_s=round(res.wall_s, 3), tokens_per_s=round(res.total_tokens / res.wall_s, 1),
            total_tokens=res.total_tokens, identical_to_full=all(same for _, same in runs[name]),
            sched_overhead=round(res.timing.scheduler_share, 4), step_overhead=round(res.timing.step_overhead, 4),
            prefill_passes=res.stats.prefill_passes, preemptions=res.stats.preemptions))
        timelines[name] = list(res.kv.timeline)
    for name in hf:
        run = min(runs[name], key=lambda r: r.wall_s)
        rows.append(EngineBenchRow(
            policy=name, decode_steps=run.decode_steps, peak_kv_bytes=run.peak_kv_bytes, wall_s=round(run.wall_s, 3),
            tokens_per_s=round(run.total_tokens / run.wall_s, 1), total_tokens=run.total_tokens,
            identical_to_full=run.outputs == reference, sched_overhead=None, step_overhead=None,
            prefill_passes=None, preemptions=None))
        timelines[name] = run.kv_timeline
    return rows, timelines

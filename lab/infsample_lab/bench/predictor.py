"""``infsample eval-predictor``: how well ``learned`` predicts, and what the scheduler makes of it.

    infsample eval-predictor --model DIR [--k 8] [--json]      # rolls the model out (TransformersEngine)
    infsample eval-predictor --tiny modes [--k 8] [--json]     # the tiny model whose first tokens tell the length
    infsample eval-predictor --trace-train A.jsonl --trace B.jsonl [--k 8] [--json]   # token traces (real models)

Protocol: training rollouts (``--train-rollouts`` epochs over training prompts, other seeds) warm the predictor up,
online, as in training; then a test rollout over *disjoint* prompts (never seen: ``history`` knows only the global
mean there). On the test rollout, replayed through the real scheduler (``ReplayEngine``: the predictor reads the
test samples' tokens and learns from their finished siblings as it would live), we record each sample's prediction
when it has generated k tokens and compare it with its true remaining length (samples longer than k): Kendall tau
and mean absolute error, next to ``history``'s. Decode steps: ``infinite`` with ``learned``, ``history`` and ``none``,
and ``oracle``, on the same test lengths (``SimulatedEngine`` is step-exact and the engine's tokens do not depend on
the schedule). With ``--model``, three more real engine rollouts of the test prompts measure the predictor's cost per
decode step (feature extraction + prediction + learning) against the step time (their median). ``--ceiling N``
estimates the best tau any predictor could reach at k: each test sample continued N times from its first k tokens.
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass, field, fields

import numpy as np

from verl_infsample.core.capacity import Capacity, KVBudget, SlotPool
from verl_infsample.core.predictor import LengthPredictor
from verl_infsample.predict import make_predictor
from verl_infsample.predict.learned import LearnedPredictor
from verl_infsample.core.sample import Group, Sample
from verl_infsample.core.scheduler import reported_checkpoints
from verl_infsample.core.trace import TracePrompt, read_trace
from verl_infsample.engines.simulated import simulate
from verl_infsample.predict.features import TokenWindow


def kendall_tau(x, y) -> float:
    """Kendall's tau-b (ties in either ranking handled), O(n^2): fine for a few thousand samples. A ranking that
    is all ties (a constant prediction) carries no order: 0."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        return math.nan
    iu = np.triu_indices(len(x), 1)
    dx, dy = np.sign(x[:, None] - x[None, :])[iu], np.sign(y[:, None] - y[None, :])[iu]
    denom = math.sqrt(float(np.count_nonzero(dx)) * float(np.count_nonzero(dy)))
    return float((dx * dy).sum() / denom) if denom else 0.0


class TokenRecorder(LengthPredictor):
    """A predictor that predicts nothing (``max_len``) and records every step's features: turns a live rollout into
    a token trace."""

    name = "record"
    reads_tokens = True

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.token_checkpoints = frozenset(range(1, max_len + 1))  # every step
        self.steps: dict[tuple[str, int], list[tuple[float, float]]] = {}  # (entropy, stop log-prob) per token

    def predict(self, group: Group, sample: Sample) -> float:
        return float(self.max_len)

    def observe(self, group: Group, sample: Sample, length: int) -> None:
        pass

    def observe_tokens(self, group: Group, sample: Sample, window: TokenWindow) -> bool:
        self.steps.setdefault((group.prompt_id, sample.index), []).append((window.entropy, window.stop_logprob))
        return False


def record_rollout(engine, prompts: list[list[int]], prompt_ids: list[str], group_size: int, params,
                   slots: int = 64) -> list[TracePrompt]:
    """Roll ``prompts`` out on ``engine`` (a ``TransformersEngine``) and return the token trace, features included."""
    if len(set(prompt_ids)) != len(prompt_ids):
        raise ValueError("record_rollout: prompt ids must be unique within a rollout (samples are keyed by them)")
    recorder = TokenRecorder(params.max_new_tokens)
    run = engine.rollout(prompts, group_size, params, policy="lpt", capacity=SlotPool(slots), predictor=recorder,
                         prompt_ids=prompt_ids)
    trace = []
    for pid, prompt, outs in zip(prompt_ids, prompts, run.outputs):
        rows = [recorder.steps[(pid, i)] for i in range(len(outs))]
        assert all(len(r) == len(o.token_ids) for r, o in zip(rows, outs)), "a step was not recorded"
        trace.append(TracePrompt(
            pid, len(prompt), tuple(len(o.token_ids) for o in outs), tuple(int(t) for t in prompt),
            tokens=tuple(tuple(o.token_ids) for o in outs),
            logprobs=tuple(tuple(o.logprobs) for o in outs),
            entropies=tuple(tuple(h for h, _ in r) for r in rows),
            stop_logprobs=tuple(tuple(sl for _, sl in r) for r in rows)))
    return trace


@dataclass
class ScoredPredictions:
    """Every scored test sample (longer than k tokens), in one order: its true remaining length at k and what
    ``learned`` and ``history`` predicted for it there (what ``--plot`` draws)."""

    true: np.ndarray
    learned: np.ndarray
    history: np.ndarray


@dataclass
class PredictionQuality:
    k: int
    samples: int  # test samples longer than k tokens
    kendall_tau: float
    mae: float  # tokens of remaining length
    history_kendall_tau: float
    history_mae: float
    scored: ScoredPredictions


def replay_with_predictions(trace: list[TracePrompt], predictor: LengthPredictor, k: int, slots: int, max_len: int,
                            policy: str = "infinite", capacity: Capacity | None = None):
    """Replay ``trace`` under ``policy`` (``slots`` slots, or ``capacity``); returns (result, {(group, index): predicted
    remaining length at k tokens}) for every sample longer than k. A predictor that does not refine keeps its plan's
    prediction."""
    capacity = capacity or SlotPool(slots)
    refines = predictor.reads_tokens
    checkpoints = reported_checkpoints(predictor, capacity, max_len) if refines else None
    if checkpoints is not None and k not in checkpoints:
        raise ValueError(f"--k {k} is not one of {predictor.name}'s checkpoints {sorted(checkpoints)}: "
                         f"score at one of them, or use learned:k={k}")
    at_k: dict[tuple[int, int], float] = {}

    def record(sched):
        for s in sched.running:
            if s.generated == k:  # a refining predictor's estimate now (under slots the scheduler reads none)
                predicted = (min(max_len, predictor.predict(sched.groups[s.group], s)) if refines
                             else s.predicted_len)
                at_k[s.key] = max(1.0, predicted - k)

    res, sched = simulate(trace, policy, capacity, predictor, max_len=max_len, on_step=record, return_scheduler=True)
    for s in sched.samples:
        if s.true_len > k and s.key not in at_k:
            if checkpoints is not None:
                raise RuntimeError(f"sample {s.key} passed k={k} tokens without a prediction there")
            at_k[s.key] = max(1.0, s.predicted_len - k)
    return res, at_k


def _quality(trace: list[TracePrompt], k: int, learned: dict, history: dict) -> PredictionQuality:
    keys = sorted(learned)
    assert keys == sorted(history), "both predictors are scored on the same samples"
    true = np.array([trace[g].lengths[i] - k for g, i in keys], dtype=float)
    lp = np.array([learned[key] for key in keys])
    hp = np.array([history[key] for key in keys])
    mae = (lambda p: round(float(np.abs(p - true).mean()), 2) if keys else math.nan)
    return PredictionQuality(k=k, samples=len(keys), kendall_tau=round(kendall_tau(lp, true), 4), mae=mae(lp),
                             history_kendall_tau=round(kendall_tau(hp, true), 4), history_mae=mae(hp),
                             scored=ScoredPredictions(true, lp, hp))


@dataclass
class PredictorEvaluation:
    predictor: str
    k: int
    slots: int
    capacity: str  # what the scheduler comparison ran under: M slots, or a KV budget (--kv-budget)
    train_rollouts: int
    train_samples: int
    test_samples: int
    kendall_tau: float  # learned, predicted vs true remaining length at k tokens, test samples longer than k
    mae: float
    history_kendall_tau: float
    history_mae: float
    decode_steps: dict[str, int]  # infinite with learned / history / none, and oracle, on the test rollout
    preemptions: dict[str, int]  # the same runs' preemptions (nonzero only under a KV budget)
    steps_vs_oracle: float  # learned / oracle
    history_steps_vs_oracle: float
    lower_bound_steps: int
    trained_checkpoints: list[int]
    cost: dict = field(default_factory=dict)  # the predictor's share of real decode time (--model only)
    ceiling_kendall_tau: float | None = None  # Monte Carlo best at k tokens (--ceiling N, --model only)
    ceiling_continuations: int = 0
    scored: ScoredPredictions | None = field(default=None, repr=False, metadata={"json": False})  # per sample

    def as_dict(self) -> dict:
        """The figures, as plain JSON types (the per-sample predictions left out)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.metadata.get("json", True)}


def evaluate_predictor(train: list[list[TracePrompt]], test: list[TracePrompt], *, spec: str = "learned:k=8",
                       k: int = 8, slots: int = 8, max_len: int, seed: int = 0,
                       predictor: LengthPredictor | None = None, progress=lambda items, desc: items,
                       capacity: Capacity | None = None) -> tuple[PredictorEvaluation, LengthPredictor]:
    """Warm ``spec`` up on the ``train`` rollouts (replayed in order, learning online), then test it on ``test``, all
    under ``slots`` slots or ``capacity`` (e.g. a ``KVBudget``). Returns the evaluation and a copy of the warmed-up
    predictor as it was before the test rollout."""
    capacity = capacity or SlotPool(slots)
    learned = predictor if predictor is not None else make_predictor(spec, seed=seed, max_len=max_len)
    history = make_predictor("history", seed=seed, max_len=max_len)
    for rollout in progress(train, "warm-up"):
        simulate(rollout, "infinite", capacity, learned, max_len=max_len)
        simulate(rollout, "infinite", capacity, history, max_len=max_len)
    warm = copy.deepcopy(learned)
    res_learned, at_k = replay_with_predictions(test, learned, k, slots, max_len, capacity=capacity)
    res_history, at_k_history = replay_with_predictions(test, history, k, slots, max_len, capacity=capacity)
    runs = {"learned": res_learned, "history": res_history,
            "none": simulate(test, "infinite", capacity, "none", max_len=max_len),
            "oracle": simulate(test, "oracle", capacity, max_len=max_len)}
    steps = {name: r.decode_steps for name, r in runs.items()}
    oracle = runs["oracle"]
    q = _quality(test, k, at_k, at_k_history)
    trained = learned.trained_checkpoints() if isinstance(learned, LearnedPredictor) else []
    return PredictorEvaluation(
        predictor=learned.name, k=k, slots=slots, capacity=str(capacity), train_rollouts=len(train),
        train_samples=sum(p.group_size for r in train for p in r), test_samples=sum(p.group_size for p in test),
        kendall_tau=q.kendall_tau, mae=q.mae, history_kendall_tau=q.history_kendall_tau, history_mae=q.history_mae,
        decode_steps=steps, preemptions={name: r.preemptions for name, r in runs.items()},
        steps_vs_oracle=round(steps["learned"] / steps["oracle"], 4),
        history_steps_vs_oracle=round(steps["history"] / steps["oracle"], 4),
        lower_bound_steps=oracle.lower_bound_steps, trained_checkpoints=trained, scored=q.scored), warm


# --- the tiny model (or any local model) -----------------------------------------------------------------------------
@dataclass
class ModelRollouts:
    """Token traces of a model's rollouts: ``train`` (one per epoch) and ``test`` (disjoint prompts)."""

    train: list[list[TracePrompt]]
    test: list[TracePrompt]
    test_prompts: list[list[int]]
    params: object  # SamplingParams of the test rollout


def model_rollouts(model_dir: str, *, train_rollouts: int = 4, train_prompts: int = 16, train_group: int = 16,
                   test_prompts: int = 8, test_group: int = 32, max_new_tokens: int = 128, seed: int = 0,
                   eos_bias: float = 0.0, engine=None, progress=lambda items, desc: items) -> ModelRollouts:
    """Roll out the model on generated task prompts (``models.tiny.model_prompts``: the tiny model's variant's, the
    default's for any other model): training epochs at seeds
    ``seed + 1 ...`` over one prompt set, the test at ``seed`` over another (in shuffled order), minus any prompt
    text both share."""
    from transformers import AutoTokenizer

    from verl_infsample.engines.sampling import SamplingParams
    from verl_infsample.engines.transformers_engine import TransformersEngine
    from ..models.tiny import model_prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = engine or TransformersEngine.from_pretrained(model_dir)
    train_texts = list(dict.fromkeys(model_prompts(model_dir, train_prompts, seed=20_000 + seed)))  # id = text
    test_texts = [t for t in dict.fromkeys(model_prompts(model_dir, test_prompts + 8, seed=30_000 + seed))
                  if t not in set(train_texts)][:test_prompts]
    # default_prompts cycles through the task kinds in a fixed order, so the batch order (which breaks ties in the
    # plan: with equal predictions, groups go in batch order) would always end on the same kinds; shuffle it
    random.Random(seed).shuffle(test_texts)
    encode = (lambda texts: [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                     tokenize=True, return_dict=False) for t in texts])
    stop = (tok.eos_token_id,)
    bias = ((tok.eos_token_id, eos_bias),) if eos_bias else ()

    def params(s):
        return SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop, seed=s, logit_bias=bias)

    train = [record_rollout(engine, encode(train_texts), train_texts, train_group, params(seed + 1 + e))
             for e in progress(range(train_rollouts), "rollouts")]
    test_ids = encode(test_texts)
    test = record_rollout(engine, test_ids, test_texts, test_group, params(seed))
    return ModelRollouts(train, test, test_ids, params(seed))


def ceiling_predictions(engine, trace: list[TracePrompt], k: int, params, continuations: int = 24,
                        slots: int = 64) -> dict[tuple[int, int], float]:
    """The best any predictor could do at k tokens, estimated: every test sample longer than k is continued
    ``continuations`` times from its prompt and its own first k tokens (fresh random streams, the test's sampling
    otherwise), and its prediction is the geometric mean of their remaining lengths. What is left between that and
    the true length is the model's own randomness after k tokens: no features can rank it. Keys as
    ``replay_with_predictions``'s."""
    from dataclasses import replace

    if continuations < 1:
        raise ValueError(f"--ceiling must be >= 1 continuations per sample, got {continuations}")
    keys = [(g, i) for g, p in enumerate(trace) for i, n in enumerate(p.lengths) if n > k]
    if not keys:
        return {}
    if any(trace[g].prompt_tokens is None or trace[g].tokens is None for g, _ in keys):
        raise ValueError("the Monte Carlo ceiling needs a trace with prompt and response token ids")
    prefixes = [list(trace[g].prompt_tokens) + list(trace[g].tokens[i][:k]) for g, i in keys]
    cont = replace(params, max_new_tokens=params.max_new_tokens - k, seed=params.seed + 1_000_003)
    run = engine.rollout(prefixes, continuations, cont, policy="continuous", capacity=SlotPool(slots),
                         prompt_ids=[f"{trace[g].prompt_id}#{i}" for g, i in keys])
    return {key: float(np.exp(np.mean([np.log(max(1, len(o.token_ids))) for o in outs])))
            for key, outs in zip(keys, run.outputs)}


def measure_cost(engine, rollouts: ModelRollouts, predictor: LengthPredictor, slots: int, repeats: int = 3,
                 capacity: Capacity | None = None) -> dict:
    """Real engine rollouts of the test prompts with ``predictor`` (each from its state as given: as warm as for the
    replayed test, so the decode steps should match the replay's): the predictor's time per decode step against the
    step's. The median of ``repeats`` rollouts: on a shared machine one rollout's wall-clock share is noisy."""
    runs = []
    for _ in range(repeats):
        res = engine.rollout(rollouts.test_prompts, rollouts.test[0].group_size, rollouts.params, policy="infinite",
                             capacity=capacity or SlotPool(slots), predictor=copy.deepcopy(predictor),
                             prompt_ids=[p.prompt_id for p in rollouts.test])
        step_ms = res.timing.engine_s * 1e3 / max(1, res.stats.decode_steps)
        per_step = (res.stats.refine_ms + res.stats.predict_ms) / max(1, res.stats.decode_steps)
        runs.append((per_step / step_ms, step_ms, per_step, res.stats.decode_steps))
    share, step_ms, per_step, steps = sorted(runs)[len(runs) // 2]
    return {"decode_steps": steps, "step_ms": round(step_ms, 3), "predictor_ms_per_step": round(per_step, 4),
            "predictor_share": round(share, 4), "predictor_share_runs": [round(r[0], 4) for r in runs]}


# --- the command line ------------------------------------------------------------------------------------------------
def add_eval_predictor_parser(sub) -> None:
    p = sub.add_parser("eval-predictor", help="train and test the learned length predictor on disjoint rollouts")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a local model folder to roll out (e.g. the tiny model: make-tiny-model DIR)")
    src.add_argument("--tiny", choices=["default", "modes", "modes-quick"],
                     help="roll out the cached tiny model of this variant (built on first use); modes: its first "
                          "tokens tell the length (direct / count / step answers); modes-quick: its tests' build")
    src.add_argument("--trace", help="test rollouts: a JSONL trace with token ids (core/trace.py: prompt_tokens, "
                                     "tokens, optionally logprobs/entropies/stop_logprobs); needs --trace-train")
    p.add_argument("--trace-train", action="append", default=[],
                   help="with --trace: a training rollout's trace (repeat: one per epoch, replayed in order)")
    p.add_argument("--k", type=int, default=8, help="tokens generated when predictions are scored (default 8)")
    p.add_argument("--predictor", default=None, help="spec of the predictor under test (default learned:k=K)")
    p.add_argument("--slots", type=int, default=8, help="M: samples decoded at once in the scheduler comparison")
    p.add_argument("--kv-budget", type=int, default=None, metavar="TOKENS",
                   help="run the warm-up, the test and the comparison under a KV budget of TOKENS instead of --slots "
                        "(preemptions reported; the checkpoints between 1 and k are then read and trained)")
    p.add_argument("--max-len", type=int, default=128, help="response cap (--model: max new tokens)")
    p.add_argument("--train-rollouts", type=int, default=4, help="--model: training epochs before the test")
    p.add_argument("--train-prompts", type=int, default=16)
    p.add_argument("--train-group", type=int, default=16, help="--model: samples per training prompt")
    p.add_argument("--test-prompts", type=int, default=8)
    p.add_argument("--test-group", type=int, default=32, help="--model: samples per test prompt")
    p.add_argument("--eos-bias", type=float, default=0.0, help="--model: added to the eos logit (moves lengths)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ceiling", type=int, default=0, metavar="N",
                   help="--model: also estimate the best tau any predictor could reach at k tokens, by continuing "
                        "each test sample N times from its first k tokens (0: off; 24 is plenty)")
    p.add_argument("--threads", type=int, default=1, help="--model: torch threads")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw predicted against true remaining length at k (learned and history) and the decode "
                        "steps each predictor reaches, next to oracle's")
    p.set_defaults(func=_cmd_eval_predictor)


def _cmd_eval_predictor(args) -> int:
    from verl_infsample.report import format_table, progress

    if args.k < 1:
        raise ValueError(f"--k must be >= 1 (tokens generated when predictions are scored), got {args.k}")
    if args.slots < 1:
        raise ValueError(f"--slots must be >= 1, got {args.slots}")
    if args.kv_budget is not None and args.kv_budget <= args.max_len:
        raise ValueError(f"--kv-budget {args.kv_budget} fits no sample of up to --max-len {args.max_len} tokens plus "
                         "its prompt: give more tokens")
    if args.ceiling < 0:
        raise ValueError(f"--ceiling must be >= 1 continuations per sample (0: off), got {args.ceiling}")
    if args.ceiling and args.trace:
        raise ValueError("--ceiling continues samples on the model: it needs --model or --tiny, not --trace")
    capacity = KVBudget(args.kv_budget) if args.kv_budget is not None else SlotPool(args.slots)
    spec = args.predictor or f"learned:k={args.k}"
    if args.tiny:
        from ..models.tiny import tiny_model_path

        args.model = str(tiny_model_path(variant=args.tiny))
    if args.model:
        import torch

        from verl_infsample.engines.transformers_engine import TransformersEngine

        torch.set_num_threads(args.threads)
        engine = TransformersEngine.from_pretrained(args.model)
        rollouts = model_rollouts(args.model, train_rollouts=args.train_rollouts, train_prompts=args.train_prompts,
                                  train_group=args.train_group, test_prompts=args.test_prompts,
                                  test_group=args.test_group, max_new_tokens=args.max_len, seed=args.seed,
                                  eos_bias=args.eos_bias, engine=engine, progress=progress)
        train, test = rollouts.train, rollouts.test
    else:
        if not args.trace_train:
            raise ValueError("--trace needs at least one --trace-train FILE (training rollouts, disjoint from the "
                             "test)")
        train, test = [read_trace(f) for f in args.trace_train], read_trace(args.trace)
    result, predictor = evaluate_predictor(train, test, spec=spec, k=args.k, slots=args.slots, max_len=args.max_len,
                                           seed=args.seed, progress=progress, capacity=capacity)
    if args.model:
        result.cost = measure_cost(engine, rollouts, predictor, args.slots, capacity=capacity)
        if args.ceiling:
            best = ceiling_predictions(engine, test, args.k, rollouts.params, args.ceiling)
            keys = sorted(best)
            result.ceiling_kendall_tau = round(kendall_tau([best[key] for key in keys],
                                                           [test[g].lengths[i] - args.k for g, i in keys]), 4)
            result.ceiling_continuations = args.ceiling
    if args.plot:
        from .plots import plot_predictor_evaluation

        plot_predictor_evaluation(result, args.plot)
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    d = result.as_dict()
    print(f"{d['predictor']}: {d['train_rollouts']} training rollouts ({d['train_samples']} samples), test on "
          f"{d['test_samples']} samples of disjoint prompts, scored at k={d['k']} tokens")
    print(format_table([{"predictor": d["predictor"], "kendall_tau": d["kendall_tau"], "mae": d["mae"]},
                        {"predictor": "history", "kendall_tau": d["history_kendall_tau"], "mae": d["history_mae"]}],
                       ["predictor", "kendall_tau", "mae"]))
    print(f"scheduler comparison under {d['capacity']}:")
    print(format_table([{"policy": "infinite" if n != "oracle" else "oracle", "predictor": n, "decode_steps": v,
                         "vs_oracle": round(v / d["decode_steps"]["oracle"], 4), "preemptions": d["preemptions"][n]}
                        for n, v in d["decode_steps"].items()],
                       ["policy", "predictor", "decode_steps", "vs_oracle", "preemptions"]))
    if d["ceiling_kendall_tau"] is not None:
        print(f"ceiling (best any predictor could do at k={d['k']}, {d['ceiling_continuations']} continuations per "
              f"sample): kendall_tau {d['ceiling_kendall_tau']}")
    if d["cost"]:
        print(f"predictor cost: {d['cost']['predictor_ms_per_step']} ms per decode step of {d['cost']['step_ms']} ms "
              f"({100 * d['cost']['predictor_share']:.2f}%)")
    return 0

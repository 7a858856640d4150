"""``infsample replay``: every backend on one trace, step by step, each replica through vLLM's own scheduler.

For each rollout step of the trace, each backend routes and orders the step's requests (``backends``), every
replica replays its share (``vllm_replica``; the replicas run in parallel over ``workers`` processes, as the
replicas of a real rollout run side by side), and the backend hears what finished before the next step. A step's
rollout ends with its slowest replica: ``engine_steps`` and ``model_s`` are that replica's.
"""

from __future__ import annotations

import atexit
import math
import multiprocessing
import multiprocessing.pool
import os
from collections import deque
from dataclasses import asdict, dataclass, field

from verl_infsample.core.trace import OPENING_TOKENS, TracePrompt, rollout_steps
from .backends import BACKENDS, ROUTERS, StepSample, agent_loop_arrivals, make_backend, step_samples
from .drafts import PAST_LIMIT, SPECS, DraftSetup, PastResponse
from .hardware import GPUS, MODELS, Calibration, StepCostModel
from .held_rests import replay_held
from .vllm_replica import ReplicaReplay, ReplicaResult, ReplicaSetup, ReplayError, ReplayRequest, model_config_dir


@dataclass(frozen=True)
class ReplayConfig:
    """What is replayed on what: verl's rollout config and the hardware (the CLI's flags)."""

    gpu: str = "h200"
    model: str = "qwen3-8b"
    tp: int = 1
    replicas: int = 1
    gpu_memory_utilization: float = 0.5  # verl's rollout default
    num_blocks: int | None = None  # the KV pool per replica; None: sized as vLLM sizes it
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    max_response_length: int | None = None  # None: the trace's longest sample
    agent_workers: int = 8  # verl's rollout.agent.num_workers
    backends: tuple[str, ...] = BACKENDS
    predictor: str = "history"
    router: str = "verl"  # infinite's and oracle's: verl's own (the product's on vLLM), or "group_affinity" (ours)
    probe_tokens: int = 16  # infinite with a trace's prediction (noisy, oracle): it is revealed after this probe
    seed: int = 0
    calibration: Calibration = field(default_factory=Calibration)
    workers: int = 2  # processes replaying replicas side by side
    keep_timeline: bool = False
    specs: tuple[str, ...] = ("off",)  # drafts, each backend with each (``drafts.SPECS``)
    spec_tokens: int = 8  # custom.speculative_tokens
    spec_accept: float | None = None  # the synthetic drafter's acceptance (None: the trace's tokens)

    def drafts(self, spec: str) -> DraftSetup:
        return DraftSetup(spec, self.spec_tokens, self.spec_accept, self.seed)

    def check(self) -> None:
        def bad(key, why):
            raise ValueError(f"--{key.replace('_', '-')}: {why}")

        if self.gpu not in GPUS:
            bad("gpu", f"unknown {self.gpu!r}; choose from {', '.join(GPUS)}")
        if self.model not in MODELS:
            bad("model", f"unknown {self.model!r}; choose from {', '.join(MODELS)}")
        if self.probe_tokens < 0:
            bad("probe_tokens", f"must be >= 0 (0: predictions at submission, no probe), got {self.probe_tokens}")
        for key in ("tp", "replicas", "max_num_seqs", "max_num_batched_tokens", "block_size", "agent_workers",
                    "workers"):
            if getattr(self, key) < 1:
                bad(key, f"must be >= 1, got {getattr(self, key)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            bad("max_num_batched_tokens", f"must be >= --max-num-seqs ({self.max_num_seqs}), as vLLM requires")
        if not 0 < self.gpu_memory_utilization <= 1:
            bad("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_blocks is not None and self.num_blocks < 2:
            bad("num_blocks", f"must be >= 2 (block 0 is vLLM's null block), got {self.num_blocks}")
        if self.max_response_length is not None and self.max_response_length < 1:
            bad("max_response_length", f"must be >= 1, got {self.max_response_length}")
        if MODELS[self.model].kv_heads % self.tp and self.tp % MODELS[self.model].kv_heads:
            bad("tp", f"{self.tp} does not divide {self.model}'s {MODELS[self.model].kv_heads} KV heads")
        for b in self.backends:
            if b not in BACKENDS:
                bad("backend", f"unknown {b!r}; choose from {', '.join(BACKENDS)}")
        if not self.backends:
            bad("backend", "name at least one")
        if self.router not in ROUTERS:
            bad("router", f"unknown {self.router!r}; choose from {', '.join(ROUTERS)}")
        if not self.specs:
            bad("spec", f"name at least one of {', '.join(SPECS)}")
        for spec in self.specs:
            self.drafts(spec).check()
        if "transformers" in self.backends and any(spec != "off" for spec in self.specs):
            bad("spec", "the transformers engine does not draft (custom.speculative needs custom.engine=vllm): "
                        "leave it out of --backend, or run --spec off")

    @property
    def cost(self) -> StepCostModel:
        return StepCostModel(GPUS[self.gpu], MODELS[self.model], self.tp, self.calibration)

    def pool_blocks(self) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        return self.cost.kv_pool_blocks(self.gpu_memory_utilization, self.block_size, self.max_num_batched_tokens,
                                        self.max_num_seqs)


@dataclass
class StepRow:
    """One backend's rollout of one trace step (the ``--json`` object)."""

    backend: str
    spec: str  # its drafts: off, ngram, suffix, group (``suffix@0.6``: the synthetic drafter at acceptance 0.6)
    predictor: str
    step: int
    samples: int
    engine_steps: int  # the slowest replica's
    lower_bound_steps: int  # one token a step: max(longest sample, generated tokens / (replicas x max_num_seqs))
    model_s: float  # modeled seconds of the slowest replica
    preemptions: int
    recomputed_tokens: int
    computed_tokens: int
    prefix_hit_tokens: int
    probes: int  # samples run as a probe and its rest
    probe_prefill_tokens: int  # the rests' prompt tokens not served from the prefix cache (in computed_tokens)
    peak_kv_blocks: int  # the fullest replica's
    kv_blocks: int  # per replica
    plan_checks: int  # releases at which the held rests' longest-first order was checked against the FPTAS plan
    order_vs_plan: float  # worst check: longest first's planned makespan over the plan's (1.0: the plan's own)
    mean_running: float  # rows per engine step, over replicas
    replica_steps: list[int]
    tokens_per_step: float  # tokens a row sampled per step it decoded (1.0: drafts off, or none accepted)
    drafted_per_step: float  # draft tokens verified per row and step
    propose_s: float  # the drafter's modeled time on the slowest replica (in its model_s)
    # drafts off: the slowest replica's steps scheduled synchronously, a drafter drafting nothing (what drafts
    # cost before they gain anything: vLLM turns async scheduling off for the group drafter)
    synchronous_s: float
    # our router only: the share of this step's requests whose prompt was served before that went back to its
    # replica (None: none had a past), and the work placed beyond the least-loaded replica, over the work placed
    past_found: float | None = None
    past_stray: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReplicaJob:
    """One replica of one backend for a worker process: its requests and how its vLLM runs them. ``held``: the
    replica's order and its requests in it (``InfiniteBackend.held_rests``), where the probes' rests wait in that
    order, which comes back having learned the step."""

    backend: int  # the backend's index in the replay
    replica: int
    config: ReplayConfig
    scheduling_policy: str
    watermark: float
    held: object
    requests: list
    drafts: DraftSetup | None = None
    past: tuple = ()  # what the replica's drafter holds from earlier steps (``drafts.PastResponse``, oldest first)

    @property
    def work(self) -> int:
        return sum(q.length for q in self.requests)


def _replay_replica(job: ReplicaJob) -> tuple[int, int, ReplicaResult, object]:
    """A worker process's job: (backend, replica, its result, the order it learned in, if held)."""
    config, requests = job.config, job.requests
    model = MODELS[config.model]
    setup = ReplicaSetup(num_blocks=config.pool_blocks(), block_size=config.block_size,
                         max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                         max_model_len=_max_model_len(requests, job.past), scheduling_policy=job.scheduling_policy,
                         watermark=job.watermark)
    replay = ReplicaReplay(model_config_dir(model), setup, config.cost, model.vocab,
                           keep_timeline=config.keep_timeline, rests_held=job.held is not None, drafts=job.drafts)
    replay.recall(job.past)
    if job.held is not None:
        order, ordered = job.held
        return job.backend, job.replica, replay_held(replay, requests, order, ordered), order
    return job.backend, job.replica, replay.run(requests), None


_POOL: dict[tuple[int, str], multiprocessing.pool.Pool] = {}  # the one pool kept, by (processes, vLLM log level)


def _replica_pool(processes: int) -> multiprocessing.pool.Pool:
    """Worker processes (vLLM logging errors only, or ``$VLLM_LOGGING_LEVEL``: it logs to stdout) with a fixed
    ``PYTHONHASHSEED``: vLLM's scheduler iterates sets of request ids in places (which blocks are freed first, so which
    cached blocks are evicted first), and a process's string hashes decide that order. With the seed fixed, a replay
    gives the same figures every time. The pool is kept for the next replay of this process (each worker's import of
    vLLM's scheduler costs seconds; a table of replays would pay it per cell) unless that one asks for another size
    or log level; it ends at exit."""
    key = (processes, os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"))
    if key in _POOL:
        return _POOL[key]
    _drop_pool()
    env = {"PYTHONHASHSEED": REPLAY_HASH_SEED, "VLLM_LOGGING_LEVEL": key[1]}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # what the spawned workers start with
    try:
        pool = _POOL[key] = multiprocessing.get_context("spawn").Pool(processes)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    return pool


def _drop_pool() -> None:
    """End the kept pool, jobs still queued in it included (a replay that failed leaves some)."""
    for pool in _POOL.values():
        pool.terminate()
    _POOL.clear()


atexit.register(_drop_pool)  # before the interpreter tears down what a running pool's finalizer needs


REPLAY_HASH_SEED = "0"


def _simulate_replica(backend, replica: int, config: ReplayConfig, requests: list[ReplayRequest],
                      cap: int) -> ReplicaResult:
    from .transformers_engine import simulate_replica

    return simulate_replica(requests, backend.predictors[replica], config.cost, config.pool_blocks(),
                            config.block_size, config.max_num_seqs, cap, config.max_num_batched_tokens)


def _max_model_len(requests: list[ReplayRequest], past=()) -> int:
    """The longest request's tokens, or the longest response the drafter recalls (vLLM's drafters skip a sequence
    at the model's length)."""
    return max(max((len(r.prompt_tokens) + r.length + (r.rest.length if r.rest else 0) for r in requests), default=16),
               max((len(p.prompt) + len(p.tokens) + 1 for p in past), default=0))


def replay(trace: list[TracePrompt], config: ReplayConfig, progress=None, on_jobs=None):
    """Replay ``trace`` on every backend of ``config``. Returns (rows, timelines): one :class:`StepRow` per backend
    and step, and per backend the (modeled seconds, running rows) points of each replica of the last step.
    ``on_jobs(step, jobs)``: sees each step's :class:`ReplicaJob` s (every replica's requests as its server sends
    them) before they run: what a real engine runs to compare with the replay (the GPU check)."""
    config.check()
    cap = config.max_response_length or max(n for p in trace for n in p.lengths)
    _check_pool(trace, config, cap)
    _check_openings(trace, config, cap)
    _check_tokens(trace, config)
    backends = []
    for name in config.backends:
        for spec in config.specs:
            b = make_backend(name, config.replicas, config.predictor, cap, config.seed, config.router,
                             config.probe_tokens, config.max_num_seqs)
            b.drafts = config.drafts(spec)
            b.past = [deque(maxlen=PAST_LIMIT) for _ in range(config.replicas)]  # kept where it drafts
            backends.append(b)
    pool = _replica_pool(min(config.workers, config.replicas * len(backends)))
    try:
        return _replay_steps(trace, config, backends, pool, cap, progress, on_jobs)
    except BaseException:
        _drop_pool()
        raise


def _check_openings(trace: list[TracePrompt], config: ReplayConfig, cap: int) -> None:
    """A predictor that reads each sample's opening (``learned``: the probe's first k tokens, as the server's
    ``VLLMRequestOrder`` sizes it) needs the trace to have that much of each sample."""
    from verl_infsample.integration.rollout.vllm.order import VLLMRequestOrder
    from verl_infsample.predict import make_predictor

    if "infinite" not in config.backends:
        return
    k = VLLMRequestOrder("longest_first", make_predictor(config.predictor, max_len=cap)).probe_tokens
    if k and any(len(p.opening(i)) < min(n, k) for p in trace for i, n in enumerate(p.lengths)):
        raise ValueError(f"--predictor {config.predictor}: it reads each sample's opening (its first {k} tokens), "
                         "and this trace has fewer for some samples; make the trace with `infsample trace "
                         f"from-verl` (it keeps {OPENING_TOKENS}) and take k <= {OPENING_TOKENS}")


def _check_tokens(trace: list[TracePrompt], config: ReplayConfig) -> None:
    """Drafts are checked against what each sample generated: the trace must have its tokens, or the run a
    synthetic acceptance."""
    if config.spec_accept is not None or all(spec == "off" for spec in config.specs):
        return
    missing = next((p for p in trace if p.tokens is None), None)
    if missing is not None:
        raise ValueError(f"--spec {','.join(config.specs)}: drafts are verified against each sample's recorded "
                         f"tokens, and prompt {missing.prompt_id!r} (step {missing.step}) has none; make the trace "
                         "with `infsample trace from-verl --keep-tokens` or `infsample trace from-text`, or give "
                         "--spec-accept A (synthetic: each draft token accepted with probability A)")


def _replay_steps(trace: list[TracePrompt], config: ReplayConfig, backends, pool, cap: int, progress, on_jobs=None):
    """:func:`replay`'s steps, one after another, each backend's replicas in ``pool``."""
    model = MODELS[config.model]
    rows, timelines = [], {}
    for step_index, prompts in enumerate(rollout_steps(trace)):
        samples = step_samples(prompts, step_index, cap, model.vocab)
        arrivals = agent_loop_arrivals(samples, config.agent_workers)
        routed = [b.route(arrivals) for b in backends]
        jobs = [ReplicaJob(k, r, config, b.scheduling_policy, b.watermark, b.held_rests(r), reqs, b.drafts,
                           tuple(b.past[r]) if b.drafts.on else ())
                for k, (b, per_replica) in enumerate(zip(backends, routed)) for r, reqs in enumerate(per_replica)
                if reqs]
        if on_jobs is not None:
            on_jobs(step_index, jobs)
        on_vllm = [j for j in jobs if backends[j.backend].engine == "vllm"]
        on_vllm.sort(key=lambda j: -j.work)  # the longest first: the workers end together
        results: dict[tuple[int, int], ReplicaResult] = {}
        replayed = pool.imap_unordered(_replay_replica, on_vllm)  # runs in the workers while ...
        for job in jobs:  # ... the transformers engine's replicas simulate here
            if backends[job.backend].engine == "transformers":
                results[(job.backend, job.replica)] = _simulate_replica(backends[job.backend], job.replica, config,
                                                                        job.requests, cap)
                if progress is not None:
                    progress(1)
        for key, replica, res, order in replayed:
            if order is not None:
                backends[key].adopt(replica, order)
            results[(key, replica)] = res
            if progress is not None:
                progress(1)
        by_id = {s.request_id: s for s in samples}
        for k, b in enumerate(backends):
            per_replica = [results.get((k, r), ReplicaResult()) for r in range(config.replicas)]
            b.observe([[(by_id[rid], n) for rid, n in res.finished] for res in per_replica])
            for r, res in enumerate(per_replica if b.drafts.on else ()):  # the drafter's memory on that replica
                b.past[r].extend(PastResponse(by_id[rid].prompt_id if b.names_groups else None,
                                              by_id[rid].prompt_tokens, by_id[rid].tokens)
                                 for rid, _ in res.finished if by_id[rid].tokens is not None)
            rows.append(_row(b, config, prompts, samples, per_replica, step_index))
            timelines[_label(b)] = [res.timeline for res in per_replica]
    return rows, timelines


def _label(backend) -> str:
    return backend.name if not backend.drafts.on else f"{backend.name}+{backend.drafts.label}"


def _row(backend, config: ReplayConfig, prompts, samples: list[StepSample], per_replica: list[ReplicaResult],
         step_index: int) -> StepRow:
    generated = sum(s.length for s in samples)
    busy = [r for r in per_replica if r.engine_steps]
    slowest = max(per_replica, key=lambda r: r.model_s)
    decode_rows = max(1, sum(r.decode_rows for r in per_replica))
    return StepRow(
        backend=backend.name, spec=backend.drafts.label, predictor=backend.predictor if backend.name != "vllm" else "-",
        step=prompts[0].step, samples=len(samples),
        engine_steps=max(r.engine_steps for r in per_replica),
        lower_bound_steps=max(max(s.length for s in samples),
                              math.ceil(generated / (config.replicas * config.max_num_seqs))),
        model_s=round(max(r.model_s for r in per_replica), 3),
        preemptions=sum(r.preemptions for r in per_replica),
        recomputed_tokens=sum(r.recomputed_tokens for r in per_replica),
        computed_tokens=sum(r.computed_tokens for r in per_replica),
        prefix_hit_tokens=sum(r.prefix_hit_tokens for r in per_replica),
        probes=sum(r.probes for r in per_replica),
        probe_prefill_tokens=sum(r.probe_prefill_tokens for r in per_replica),
        peak_kv_blocks=max(r.peak_kv_blocks for r in per_replica), kv_blocks=config.pool_blocks(),
        plan_checks=sum(r.plan_checks for r in per_replica),
        order_vs_plan=round(max(r.order_vs_plan for r in per_replica), 5),
        mean_running=round(sum(r.running_step_sum / r.engine_steps for r in busy) / max(1, len(busy)), 2),
        replica_steps=[r.engine_steps for r in per_replica],
        tokens_per_step=round(sum(r.output_tokens for r in per_replica) / decode_rows, 4),
        drafted_per_step=round(sum(r.drafted for r in per_replica) / decode_rows, 4),
        propose_s=round(slowest.propose_s, 3),
        synchronous_s=round(max(r.synchronous_s for r in per_replica), 3),
        **getattr(backend, "step_past", {}))


def _check_pool(trace: list[TracePrompt], config: ReplayConfig, cap: int) -> None:
    """A sample that can never fit a replica's pool would be preempted forever: refuse the run, naming it."""
    blocks = config.pool_blocks()
    if blocks < 2:
        raise ReplayError(f"--gpu-memory-utilization {config.gpu_memory_utilization} leaves no KV pool for "
                          f"{config.model} on {config.gpu} with --tp {config.tp}: raise it, or --tp, or set "
                          "--num-blocks")
    worst = max(trace, key=lambda p: p.prompt_len + min(max(p.lengths), cap))
    need = -(-(worst.prompt_len + min(max(worst.lengths), cap)) // config.block_size)
    if need > blocks - 1:
        raise ReplayError(
            f"prompt {worst.prompt_id!r} (step {worst.step}): {worst.prompt_len} prompt + "
            f"{min(max(worst.lengths), cap)} response tokens need {need} KV blocks of {config.block_size}, but a "
            f"replica's pool has {blocks - 1}: raise --num-blocks or --gpu-memory-utilization, or lower "
            "--max-response-length")

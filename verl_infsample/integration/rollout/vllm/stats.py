"""What a vLLM rollout server did in a step, from vLLM's own per-iteration stats: the same figures for verl's
``rollout.name=vllm`` server and ours, so they compare like for like.

:class:`RolloutStatsLogger` is a vLLM stat logger (``StatLoggerBase``): the engine's front end calls ``record`` once
per engine step. :func:`instrument` makes the ``AsyncLLM`` that verl's ``vLLMHttpServer.run_server`` builds carry it
(vLLM then keeps its own stats off: custom loggers alone do not enable its default ones). Our server always has it;
verl's is instrumented where ``VERL_INFSAMPLE_VLLM_STATS=1`` and the lab is installed (``infsample bench-verl``).
The trainer mode ``infinite_sync`` reads the figures after each step, inside the server actor: our server's
``pop_step_metrics`` method, which takes this module's (:func:`pop_step_metrics`) and adds its own.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable

from ..metrics import ACCEPTED_AT, DRAFTED_AT
from .probe import PROBE_SUFFIX

STATS_ENV = "VERL_INFSAMPLE_VLLM_STATS"
SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_loggers: list = []  # every RolloutStatsLogger of this process (one per engine; several under data parallelism)
_lock = threading.Lock()
_listeners: dict[str, list[weakref.WeakMethod]] = {"step": [], "finished": []}  # bound methods, by what they hear


def on_step(listener: Callable) -> None:
    """Call ``listener(scheduler_stats)`` (vLLM's ``SchedulerStats``) after every engine step of this process, on
    the event loop of its ``AsyncLLM`` (its output handler records the stats there). Held weakly: a bound method
    of an object gone is dropped."""
    with _lock:
        _listeners["step"].append(weakref.WeakMethod(listener))


def on_finished(listener: Callable) -> None:
    """Call ``listener(request_id, finish_reason)`` for every request of this process that vLLM finished (its
    reason as vLLM names it: "stop", "length", "abort", ...), on the same event loop, when vLLM records the step
    (:func:`report_finished`). Held weakly, as :func:`on_step`'s."""
    with _lock:
        _listeners["finished"].append(weakref.WeakMethod(listener))


def report_step(scheduler_stats) -> None:
    """vLLM ran an engine step: every ``on_step`` listener hears its ``SchedulerStats`` (the stat logger reports
    each step it records)."""
    _tell("step", scheduler_stats)


def report_finished(request_id: str, finish_reason: str) -> None:
    """vLLM finished ``request_id`` for ``finish_reason``: every ``on_finished`` listener hears it (the stat
    logger reports each request it records)."""
    _tell("finished", request_id, finish_reason)


def _tell(kind: str, *args) -> None:
    if not _listeners[kind]:  # verl's own server: nothing listens
        return
    with _lock:
        refs = _listeners[kind]
        listeners = [ref() for ref in refs]
        if None in listeners:  # an object gone: its listener goes too
            refs[:] = [ref for ref, fn in zip(refs, listeners) if fn is not None]
    for fn in listeners:
        if fn is not None:
            fn(*args)


def _logger_class():
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RolloutStatsLogger(StatLoggerBase):
        """Sums what each engine step did since the last :meth:`pop` (engine steps are counted where they produced
        output: every step with a request running does)."""

        def __init__(self, vllm_config, engine_index: int = 0):
            self.cache = vllm_config.cache_config
            self.slots = int(vllm_config.scheduler_config.max_num_seqs)
            self._reset()
            with _lock:
                _loggers.append(self)

        def _reset(self) -> None:
            self.steps = self.preemptions = self.generated = self.prefilled = self.cached = self.finished = 0
            self.running = 0  # rows running, summed over the steps
            self.peak_usage = 0.0
            self.first_t = self.last_t = None
            self.step_t: list[float] = []  # each step's timestamp
            self.samples: dict[str, list] = {}  # a sample (a probe and its rest are one) -> [its arrival, its tokens]
            self.drafted = self.accepted = 0  # draft tokens verified and accepted (vLLM's scheduler counts them)
            self.drafted_at: list[int] = []  # ... by draft position
            self.accepted_at: list[int] = []

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                self.peak_usage = max(self.peak_usage, scheduler_stats.kv_cache_usage)
                if (spec := getattr(scheduler_stats, "spec_decoding_stats", None)) is not None:
                    self._drafts(spec)
                report_step(scheduler_stats)
            if iteration_stats is None:
                return
            self.steps += 1
            if scheduler_stats is not None:
                self.running += scheduler_stats.num_running_reqs
            self.preemptions += iteration_stats.num_preempted_reqs
            self.generated += iteration_stats.num_generation_tokens
            self.prefilled += iteration_stats.prompt_token_stats.computed
            self.cached += iteration_stats.prompt_token_stats.cached_tokens
            self.finished += len(iteration_stats.finished_requests)
            now = iteration_stats.iteration_timestamp
            self.first_t = self.first_t or now
            self.last_t = now
            self.step_t.append(now)
            for done in iteration_stats.finished_requests:
                if done.request_id is not None:
                    report_finished(done.request_id, str(done.finish_reason))
                key = (done.request_id or f"#{len(self.samples)}").removesuffix(PROBE_SUFFIX)
                arrival = now - done.e2e_latency
                sample = self.samples.setdefault(key, [arrival, 0])
                sample[0] = min(sample[0], arrival)
                sample[1] += done.num_generation_tokens

        def _drafts(self, spec) -> None:
            self.drafted += spec.num_draft_tokens
            self.accepted += spec.num_accepted_tokens
            for mine, theirs in ((self.drafted_at, spec.num_draft_tokens_per_pos),
                                 (self.accepted_at, spec.num_accepted_tokens_per_pos)):
                mine.extend([0] * (len(theirs) - len(mine)))
                for j, n in enumerate(theirs):
                    mine[j] += n

        def log_engine_initialized(self):
            pass

        def pop(self) -> dict:
            blocks = int(self.cache.num_gpu_blocks or 0)
            out = {"infsample/decode_steps": self.steps, "infsample/preemptions": self.preemptions,
                   "infsample/samples": self.finished,
                   "infsample/tokens_computed": self.prefilled + self.generated,
                   "infsample/total_tokens": self.generated, "infsample/cached_prompt_tokens": self.cached,
                   "infsample/peak_kv_blocks": round(self.peak_usage * blocks), "infsample/kv_blocks": blocks,
                   "infsample/kv_block_size": int(self.cache.block_size or 0),
                   "infsample/running_rows": self.running,
                   "infsample/arrival_bound_steps": self._arrival_bound(),
                   "infsample/wall_s": (self.last_t - self.first_t) if self.first_t else 0.0}
            if self.drafted:
                out.update({"infsample/spec_drafted": self.drafted, "infsample/spec_accepted": self.accepted})
                out.update({f"{DRAFTED_AT}{j}": d for j, d in enumerate(self.drafted_at)})
                out.update({f"{ACCEPTED_AT}{j}": a for j, a in enumerate(self.accepted_at)})
            self._reset()
            return out

        def _arrival_bound(self) -> int:
            """No order of this engine's samples takes fewer steps, as they arrived: a sample is in no step whose
            output came before it arrived (``core.fptas.lower_bound_with_arrivals`` over ``max_num_seqs``)."""
            import numpy as np

            from ....core.fptas import lower_bound_with_arrivals

            if not self.samples:
                return 0
            arrivals, tokens = zip(*self.samples.values())
            steps_before = np.searchsorted(np.array(self.step_t), np.array(arrivals), side="left")
            return int(np.ceil(lower_bound_with_arrivals(tokens, steps_before, self.slots) - 1e-9))

    return RolloutStatsLogger


def instrument(server_module=None) -> None:
    """Make ``server_module`` (verl's vLLM server module) build its ``AsyncLLM`` with a :class:`RolloutStatsLogger`
    (idempotent). verl reads ``AsyncLLM.from_vllm_config``'s signature, so the wrapper keeps it."""
    import importlib

    module = server_module or importlib.import_module(SERVER_MODULE)
    if getattr(module, "_infsample_stats", False):
        return
    engine_class = module.AsyncLLM
    build = engine_class.from_vllm_config
    logger_class = _logger_class()

    @functools.wraps(build)
    def from_vllm_config(*args, stat_loggers=None, **kwargs):
        return build(*args, stat_loggers=[*(stat_loggers or []), logger_class], **kwargs)

    module.AsyncLLM = type(engine_class.__name__, (engine_class,), {
        "from_vllm_config": staticmethod(from_vllm_config), "__module__": engine_class.__module__})
    module._infsample_stats = True


def pop_step_metrics(_server=None) -> dict:
    """The figures of every engine of this process since the last call, merged (steps and times: the slowest
    engine; counts: summed). Runs in the server actor: ``server.__ray_call__.remote(pop_step_metrics)``."""
    with _lock:
        parts = [lg.pop() for lg in _loggers]
    if not parts:
        return {}
    out = {key: sum(p.get(key, 0) for p in parts) for key in set().union(*parts)}
    for key in ("infsample/decode_steps", "infsample/wall_s", "infsample/kv_block_size",
                "infsample/arrival_bound_steps"):
        out[key] = max(p[key] for p in parts)
    return out

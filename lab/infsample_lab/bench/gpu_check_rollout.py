"""The GPU check's ``rollout`` part: verl's ``rollout.name=vllm`` against ``rollout.name=infinite`` on a real vLLM
engine, with response lengths forced from a reasoning-RL trace, next to ``infsample replay`` of the same requests.

The trace (``synth_rl_trace``: two training steps, so ``infinite``'s ``history`` predictor has the first to learn
from) goes through ``infsample replay`` as it always does: each backend's server builds the requests of a step
(verl's agent-loop arrival order; ``infinite``'s priorities from the product's own ``VLLMRequestOrder``), and vLLM's
scheduler runs them under the step-cost model of ``--gpu``. The second step's requests, exactly as the replay built
them, then run on a real vLLM engine per backend (its scheduling policy and watermark, the same KV pool): real
weights' shape (``load_format="dummy"``: random weights, nothing downloaded), each request ``length`` tokens with
end-of-sequence ignored. Per backend: real seconds and engine steps against the replay's modeled seconds and steps;
per batch size band, each real step's seconds against what the cost model charges that very step (its rows, the
tokens it computed and their contexts), and a fit of the real steps to the cost model's terms (``real = reads /
bandwidth_efficiency + tokens / token_flop_efficiency + step_overhead_s`` where those bind, ``compute /
flop_efficiency + step_overhead_s`` where the roofline does), whose fields are ``Calibration``'s: a GPU run's
calibration of the cost model (``infsample replay --calibration``).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from dataclasses import dataclass

import numpy as np

BANDS = ((1, 8), (9, 32), (33, 128), (129, 1 << 20))  # rows a step
BACKENDS = ("vllm", "infinite")


@dataclass(frozen=True)
class RolloutCheck:
    """The part's settings: the GPU default, or the dry run's (a tiny shape on the CPU)."""

    model: str
    prompts: int
    n: int
    max_len: int
    median: float
    prompt_len: tuple[int, int]
    kv_blocks: int | None  # None: what gpu_memory_utilization leaves (as verl sizes it)
    block_size: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.5  # verl's rollout default


GPU_DEFAULT = RolloutCheck("qwen3-8b", prompts=16, n=16, max_len=2048, median=400.0, prompt_len=(100, 600),
                           kv_blocks=None, block_size=16)
DRY_RUN = RolloutCheck("qwen3-tiny", prompts=2, n=8, max_len=48, median=16.0, prompt_len=(10, 30), kv_blocks=10,
                       block_size=32, max_num_seqs=32, max_num_batched_tokens=512)


def settings(a: argparse.Namespace) -> RolloutCheck:
    base = DRY_RUN if a.dry_run else GPU_DEFAULT
    given = {k: v for k, v in (("prompts", a.prompts), ("n", a.n), ("max_len", a.max_len)) if v is not None}
    for key, value in given.items():
        if value < 1:
            raise SystemExit(f"gpu_check: --{key.replace('_', '-')} must be >= 1, got {value}")
    return RolloutCheck(**{**base.__dict__, **given})


def band_of(rows: int) -> str:
    lo, hi = next(b for b in BANDS if b[0] <= rows <= b[1])
    return f"{lo}-{hi}" if hi < 1 << 20 else f"{lo}+"


def step_table(stats, cost) -> tuple[list[dict], dict]:
    """Per band of rows a step: the real steps' mean seconds against the cost model's for the same steps; and the
    fit of every step's real seconds to the model's terms at full efficiency (:meth:`StepCostModel.terms`):
    ``bandwidth_efficiency``, ``token_flop_efficiency`` and ``step_overhead_s`` by least squares over the steps
    where reads and tokens bind under ``cost``'s calibration, ``flop_efficiency`` over those where the roofline
    binds; an efficiency the steps cannot determine (too few steps, a slope <= 0) is None."""
    c = cost.calibration
    steps = list(zip(stats.scheduled, stats.step_wall_s))  # async scheduling: a schedule leads its outputs by one
    real, modeled, terms, rows = [], [], [], []
    for sched, wall in steps:
        if not sched.new_tokens:
            continue
        new, ctx = np.asarray(sched.new_tokens, dtype=float), np.asarray(sched.contexts, dtype=float)
        gpu_s = cost.seconds(new, ctx, sched.sampling_rows)
        real.append(wall)
        modeled.append(cost.step_seconds(gpu_s, len(new)))
        terms.append(cost.terms(new, ctx, sched.sampling_rows))
        rows.append(len(new))
    table = []
    for lo, hi in BANDS:
        pick = [i for i, r in enumerate(rows) if lo <= r <= hi]
        if not pick:
            continue
        r_ms = 1e3 * float(np.mean([real[i] for i in pick]))
        m_ms = 1e3 * float(np.mean([modeled[i] for i in pick]))
        table.append({"band_rows": band_of(lo), "steps": len(pick), "real_ms": round(r_ms, 3),
                      "modeled_ms": round(m_ms, 3), "real_vs_modeled": round(r_ms / m_ms, 3) if m_ms else None})
    y = np.asarray(real, dtype=float)
    t = np.asarray(terms, dtype=float).reshape(-1, 3)  # compute, reads, tokens
    memory = t[:, 1] / c.bandwidth_efficiency + t[:, 2] / c.token_flop_efficiency >= t[:, 0] / c.flop_efficiency
    fit: dict = {"steps": len(real), "memory_bound_steps": int(memory.sum()),
                 "compute_bound_steps": int((~memory).sum())}
    overhead = c.step_overhead_s
    a = np.column_stack([t[memory, 1], t[memory, 2], np.ones(int(memory.sum()))])
    if len(a) >= 4 and np.linalg.matrix_rank(a) == 3:
        (inv_bw, inv_tok, overhead), *_ = np.linalg.lstsq(a, y[memory], rcond=None)
        fit.update({"bandwidth_efficiency": round(float(1 / inv_bw), 4) if inv_bw > 0 else None,
                    "token_flop_efficiency": round(float(1 / inv_tok), 4) if inv_tok > 0 else None,
                    "step_overhead_s": round(float(overhead), 6)})
    busy = float(np.sum(y[~memory] - overhead))
    if int((~memory).sum()) >= 3:
        fit["flop_efficiency"] = round(float(np.sum(t[~memory, 0])) / busy, 4) if busy > 0 else None
    return table, fit


def decode_points(stats) -> list[dict]:
    """Per band of rows a step, its real decode steps (every row one new token: no prefill in them): their number,
    mean rows, mean context a row and mean seconds, the step points ``replay.calibration --add-gpu-check`` loads."""
    by_band: dict[tuple[int, int], list[tuple[int, float, float]]] = {}
    for sched, wall in zip(stats.scheduled, stats.step_wall_s):  # as step_table pairs them
        if not sched.new_tokens or any(t != 1 for t in sched.new_tokens):
            continue
        rows = len(sched.new_tokens)
        band = next(b for b in BANDS if b[0] <= rows <= b[1])
        by_band.setdefault(band, []).append((rows, float(np.mean(sched.contexts)), wall))
    return [{"band_rows": band_of(lo), "steps": len(steps), "rows": round(float(np.mean([s[0] for s in steps])), 2),
             "context": round(float(np.mean([s[1] for s in steps])), 1),
             "seconds": round(float(np.mean([s[2] for s in steps])), 7)}
            for (lo, _), steps in sorted(by_band.items())]


def run(a: argparse.Namespace, say=print) -> dict:
    """The part's report (see the module docstring). ``say``: progress lines."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from verl_infsample.core.trace import synth_rl_trace

    from ..replay.hardware import GPUS, MODELS, StepCostModel
    from ..replay.runner import ReplayConfig, replay
    from ..replay.vllm_replica import model_config_dir
    from .vllm_engine import ForcedRequest, VLLMEngine

    c = settings(a)
    shape = MODELS[c.model]
    trace = synth_rl_trace(c.prompts, c.n, c.max_len, steps=2, seed=a.seed, median=c.median,
                           prompt_len=c.prompt_len)
    model_dir = model_config_dir(shape)
    dtype = "float32" if a.dry_run else "bfloat16"
    max_model_len = c.prompt_len[1] + c.max_len
    extra = dict(enforce_eager=True, gpu_memory_utilization=0.1) if a.dry_run else dict(
        gpu_memory_utilization=c.gpu_memory_utilization)

    def engine(policy: str, watermark: float, kv_blocks: int | None):
        t0 = time.perf_counter()
        e = VLLMEngine(model_dir, kv_blocks=kv_blocks, block_size=c.block_size, max_num_seqs=c.max_num_seqs,
                       max_num_batched_tokens=c.max_num_batched_tokens, dtype=dtype, max_model_len=max_model_len,
                       seed=a.seed, load_format="dummy", scheduling_policy=policy, watermark=watermark, **extra)
        say(f"rollout: vLLM engine ({policy}, watermark {watermark}) up in {time.perf_counter() - t0:.0f} s, "
            f"{e.kv_blocks} KV blocks of {e.block_size}")
        return e

    # verl's engine first: vLLM sizes its KV pool, and the replay and the second engine get the same pool
    current = engine("fcfs", 0.0, c.kv_blocks)
    kv_blocks, block_size, max_num_seqs = current.kv_blocks, current.block_size, current.max_num_seqs
    config = ReplayConfig(gpu=a.gpu, model=c.model, num_blocks=kv_blocks, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=current.max_num_batched_tokens, block_size=block_size,
                          max_response_length=c.max_len, backends=BACKENDS, predictor="history", router="verl",
                          seed=a.seed, workers=1)
    jobs: dict[str, object] = {}

    def keep_last_step(step: int, step_jobs) -> None:
        if step == 1:
            jobs.update({BACKENDS[j.backend]: j for j in step_jobs})

    t0 = time.perf_counter()
    rows, _ = replay(trace, config, on_jobs=keep_last_step)
    say(f"rollout: replay of the trace in {time.perf_counter() - t0:.0f} s")
    modeled = {r.backend: r for r in rows if r.step == 1}
    cost = StepCostModel(GPUS[a.gpu], shape, 1, config.calibration)
    report: dict = {"gpu": a.gpu, "model": c.model, "weights": "random (load_format=dummy)", "dtype": dtype,
                    "trace": {"prompts": c.prompts, "n": c.n, "max_len": c.max_len, "median": c.median,
                              "generator": "synth_rl_trace, step 1 (step 0 taught the history predictor)"},
                    "kv_blocks": kv_blocks, "block_size": block_size, "max_num_seqs": max_num_seqs,
                    "cost_model": cost.describe(), "backends": {}}
    for name in BACKENDS:
        job = jobs[name]
        if current is None:
            current = engine(job.scheduling_policy, job.watermark, kv_blocks)
        requests = [ForcedRequest(r.request_id, r.prompt_tokens, r.length, r.priority) for r in job.requests]
        if any(r.rest is not None for r in job.requests):
            raise SystemExit("gpu_check: the rollout part runs whole requests; a probed trace needs the server")
        warm = [ForcedRequest(f"warm-{i}", r.prompt_tokens, 4, 0) for i, r in enumerate(requests[:8])]
        current.run_requests(warm, seed=a.seed + 1)  # first-step compilation and allocation, not measured
        t0 = time.perf_counter()
        stats = current.run_requests(requests, seed=a.seed)
        wall = time.perf_counter() - t0
        bands, fit = step_table(stats, cost)
        m = modeled[name]
        report["backends"][name] = {
            "real": {"wall_s": round(wall, 3), "engine_steps": stats.engine_steps, "preemptions": stats.preemptions,
                     "computed_tokens": stats.computed_tokens, "peak_kv_usage": round(stats.peak_kv_usage, 4),
                     "generated_tokens": sum(r.length for r in requests)},
            "replay": {"model_s": m.model_s, "engine_steps": m.engine_steps, "preemptions": m.preemptions,
                       "computed_tokens": m.computed_tokens, "seconds": "modeled"},
            "steps_real_vs_replay": round(stats.engine_steps / max(1, m.engine_steps), 4),
            "seconds_real_vs_modeled": round(wall / m.model_s, 4) if m.model_s else None,
            "bands": bands, "fit": fit, "decode_points": decode_points(stats)}
        say(f"rollout: {name}: {wall:.1f} s real, {stats.engine_steps} steps (replay {m.engine_steps} steps, "
            f"{m.model_s:.1f} s modeled)")
        del current
        current = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    real = {k: v["real"]["wall_s"] for k, v in report["backends"].items()}
    report["infinite_vs_vllm"] = {"real_s": round(real["infinite"] / real["vllm"], 4),
                                  "modeled_s": round(modeled["infinite"].model_s / modeled["vllm"].model_s, 4)}
    report["ok"] = all(b["real"]["engine_steps"] > 0 for b in report["backends"].values())
    return report

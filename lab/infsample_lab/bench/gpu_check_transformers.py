"""GPU check without vLLM: GPU memory of plain GRPO sampling vs Infinite Sampling on ``TransformersEngine``.

    python -m infsample_lab.bench.gpu_check_transformers             # one GPU: Qwen3-1.7B's shape, n in 32/256/1024
    python -m infsample_lab.bench.gpu_check_transformers --dry-run   # CPU: a tiny Qwen3 shape, small n, same JSON

What it needs is what a bare GPU machine with PyTorch and transformers has (no verl, no vLLM, nothing downloaded):
the model is built from Qwen3-1.7B's config with random weights, the prompts are random token ids, and a random set
of ``--stop-tokens`` ids acts as eos (random weights give near-uniform next-token distributions, so each step stops
a sample with probability about stop_tokens / vocab: geometric lengths, capped). Tokens are drawn on the GPU
(``torch_sampling``), schedule-invariant as on the CPU.

Per ``rollout.n``, on the same prompts, seed and sampling (every row on a fresh engine, so no row inherits another's
KV pool), in this order:

* ``full``: plain GRPO without a budget, a prompt's n samples decoded at once (the memory Infinite Sampling saves);
* ``infinite``: the core's plan under a KV budget of ``--kv-seqs`` worst-case sequences (prompt + max new tokens
  each), ``history`` predictor warmed by one earlier rollout at another seed (GRPO's previous epoch);
* ``plain``: verl's submission under the same budget (admit while the next step fits, preempt when it does not);
* ``hf-full``: transformers ``generate`` with ``num_return_sequences=n`` (``--no-hf`` skips it; an out-of-memory
  error is reported, not raised).

Each row: peak GPU memory (torch's peak allocated during the row, model weights included; ``weights_bytes`` says how
much of it they are; it also holds the forward pass's transients, chiefly one layer's K/V gathered for attention:
each group's prompt once, each row's own tokens, growing with the rows a step decodes), peak KV bytes in use and the
KV pool's size, decode steps, tokens/s, preemptions, and whether the tokens equal ``full``'s. A row that would start
after ``--budget-s`` seconds is skipped (reported), so the check ends inside its time limit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gc
import json
import sys
import time
from pathlib import Path

# Qwen3-1.7B's config.json (the shape only; weights are random)
QWEN3_1_7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
            tie_word_embeddings=True)


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
    """The check's command line: parse, run, print the JSON report (and write it to ``--out``), and draw it
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
    """The check's arguments; ``defaults``: option -> (GPU default, dry-run default), applied by
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


def peak_device_memory(torch, device: str):
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


_DEFAULTS = {"n": ([32, 256, 1024], [8, 32]), "prompt_len": (256, 20), "max_new_tokens": (256, 48),
             "kv_seqs": (64, 4)}


def parse_args(argv=None) -> argparse.Namespace:
    p = workload_parser("gpu_check_transformers", __doc__.split("\n\n")[0],
                        "CPU, tiny model, small n: the same comparison", _DEFAULTS)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-hf", action="store_true", help="skip transformers generate (hf-full)")
    p.add_argument("--budget-s", type=float, default=400.0, help="start no row after this many seconds")
    a = p.parse_args(argv)
    apply_defaults(p, a, _DEFAULTS, ("prompts", "prompt_len", "max_new_tokens", "kv_seqs", "block_size"))
    return a


def build_model(shape: dict, dtype, device: str, seed: int):
    """A Qwen3 model of ``shape`` with random weights, made on ``device`` (no checkpoint, no download)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**shape, hidden_act="silu", attention_bias=False, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.set_attn_implementation("sdpa")
    return model.eval()


class _Meter:
    """Peak device memory over one row (torch's allocator; None on the CPU)."""

    def __init__(self, torch, device: str):
        self.torch, self.device, self.cuda = torch, device, device == "cuda"

    def start(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self):
        return peak_device_memory(self.torch, self.device)


def run(a: argparse.Namespace) -> dict:
    import torch

    from verl_infsample.core.capacity import KVBudget, SlotPool
    from verl_infsample.predict import make_predictor
    from ..bench.hf_baseline import hf_generate
    from verl_infsample.engines.sampling import SamplingParams
    from verl_infsample.engines.transformers_engine import TransformersEngine

    device = "cpu" if a.dry_run else "cuda"
    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check_transformers: no CUDA device visible; use --dry-run on a CPU machine")
    t_start = time.perf_counter()
    shape = TINY if a.dry_run else QWEN3_1_7B
    dtype = torch.float32 if a.dry_run else torch.bfloat16
    vocab = shape["vocab_size"]
    stop_count, stop_ids, prompts = random_workload(vocab, a)
    model = build_model(shape, dtype, device, a.seed)
    meter = _Meter(torch, device)
    meter.start()
    weights = meter.peak()
    budget = KVBudget(a.kv_seqs * (a.prompt_len + a.max_new_tokens))
    params = SamplingParams(max_new_tokens=a.max_new_tokens, stop_token_ids=stop_ids, seed=a.seed)

    def engine() -> TransformersEngine:
        return TransformersEngine(model, block_size=a.block_size, sampler="torch")

    warm_up = engine()  # kernels, allocator
    warm_up.rollout(prompts, 2, SamplingParams(max_new_tokens=4, stop_token_ids=stop_ids, seed=a.seed + 2),
                    policy="full")
    bytes_per_token = warm_up.pool.stats.bytes_per_token
    del warm_up
    results = []
    for n in a.n:
        row: dict = {"n": n, "prompts": a.prompts}
        history = make_predictor("history", max_len=a.max_new_tokens)
        warm = SamplingParams(max_new_tokens=a.max_new_tokens, stop_token_ids=stop_ids, seed=a.seed + 1)
        drawn: dict[str, list] = {}  # policy -> its tokens, compared with full's
        for name in ("full", "infinite", "plain", "hf-full"):
            if name == "hf-full" and a.no_hf:
                continue
            if time.perf_counter() - t_start > a.budget_s:
                row[name] = {"skipped": f"past --budget-s {a.budget_s:g}"}
                continue
            if name == "infinite":  # GRPO's previous epoch, briefly: per-prompt lengths for the plan
                engine().rollout(prompts, min(n, 32), warm, policy="continuous", capacity=budget, predictor=history)
            meter.start()
            t = time.perf_counter()
            try:
                if name == "hf-full":
                    run_ = hf_generate(model, prompts, n, params, pad_token_id=stop_ids[0])
                    tokens, summary = run_.outputs, {"decode_steps": run_.decode_steps,
                                                     "peak_kv_bytes": run_.peak_kv_bytes}
                    total = run_.total_tokens
                else:
                    eng = engine()
                    res = eng.rollout(prompts, n, params, policy=name,
                                      capacity=SlotPool(n) if name == "full" else budget,
                                      predictor=history if name == "infinite" else "none")
                    tokens = [[o.token_ids for o in g] for g in res.outputs]
                    total = res.total_tokens
                    summary = {"decode_steps": res.stats.decode_steps, "peak_kv_bytes": res.kv.peak_in_use_bytes,
                               "kv_pool_bytes": res.kv.pool_bytes, "preemptions": res.stats.preemptions,
                               "plan_ms": round(res.stats.plan_ms, 1)}
                    del eng
            except torch.cuda.OutOfMemoryError as e:
                row[name] = {"error": "out of memory: " + str(e).split("\n")[0]}
                continue
            wall = time.perf_counter() - t
            drawn[name] = tokens
            row[name] = {"peak_gpu_memory_bytes": meter.peak(), **summary, "tokens": total,
                         "tokens_per_s": round(total / wall, 1), "wall_s": round(wall, 2)}
        for name in ("infinite", "plain"):  # (hf-full draws with its own random generator)
            if "full" in drawn and name in drawn:
                row[name]["identical_to_full"] = drawn[name] == drawn["full"]
        results.append(row)
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return {
        "date": dt.date.today().isoformat(), "dry_run": a.dry_run, "engine": "TransformersEngine",
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "model": {"shape": "tiny-qwen3" if a.dry_run else "Qwen3-1.7B", "weights": "random", "dtype": str(dtype)},
        "weights_bytes": weights, "kv_bytes_per_token": bytes_per_token,
        "kv_budget_tokens": budget.tokens, "kv_budget_worst_case_seqs": a.kv_seqs,
        "block_size": a.block_size, "prompt_len": a.prompt_len, "max_new_tokens": a.max_new_tokens,
        "stop_tokens": stop_count, "total_s": round(time.perf_counter() - t_start, 1), "results": results,
    }


def main(argv=None) -> int:
    return report_main(run, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())

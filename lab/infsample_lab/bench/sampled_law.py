"""Do drafts keep the sampled law? Samples of the tiny model from vLLM, with and without drafts, compared
(``tests/test_spec_decode_law.py`` on the CPU, the GPU check's ``law`` part on a GPU's own kernels).

Each run is a process of its own (one vLLM engine, with one speculative config):

    python -m infsample_lab.bench.sampled_law MODEL_DIR none|ngram|group SAMPLES [--seed S] [--arm PATCH]

prints one JSON object: for each prompt and each sampling setting ("t1": temperature 1; "top_p": temperature 1,
top-p 0.8; "top_k": temperature 1, top-k 20), every sample's length and mean log-probability per token (vLLM's own, of the tokens it sampled); the
greedy tokens of each prompt; the largest gap between vLLM's log-probs and transformers' recomputation of them;
the engine's spec-decode counters (drafted and accepted tokens) and, with ``group``, the drafter's own figures
(its run-time law check among them). ``--arm`` applies one of ``patches/`` itself, for a run whose vLLM loads no
plugin (``VLLM_PLUGINS``): the twin that shows the law moved without the expand fix keeps the engine running with
the other sampler fixes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = {"t1": dict(temperature=1.0), "top_p": dict(temperature=1.0, top_p=0.8),
            "top_k": dict(temperature=1.0, top_k=20)}
DRAFTS = ("none", "ngram", "group")  # vLLM's speculative_config as custom.speculative sets it, 4 draft tokens
RECOMPUTED = 8  # samples whose log-probs transformers recomputes
PROMPTS = 3
MAX_TOKENS = 48
Z_LIMIT = 4.0  # a family of 18 comparisons (3 prompts x 3 settings x 2 statistics) under one law stays well within
# the CPU sampler fixes that keep an engine with drafts running, armed where plugins are not (the expand fix, the one
# that keeps the law, left out)
RUNNING_FIXES = ("vllm_cpu_sampler_recovered_tokens.py", "vllm_cpu_sampler_empty_top_k.py")


def sample(model_dir: str, drafts: str, samples: int, plugins: bool = True, seed: int = 0, timeout: int = 900) -> dict:
    """One run's JSON (a process of its own). ``plugins=False``: vLLM loads no plugin, so the CPU expand fix is not
    armed; the fixes without which an engine with drafts stops are (``RUNNING_FIXES``), and top-k is not sampled."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    arm = []
    if not plugins:
        env["VLLM_PLUGINS"] = "none-loaded"  # vLLM loads only the general plugins it names: here, none
        # without the expand fix a top-k reaches the draft positions as garbage, which stops the engine: the settings
        # that run without it
        arm = [flag for fix in RUNNING_FIXES for flag in ("--arm", fix)] + ["--settings", "t1,top_p"]
    proc = subprocess.run([sys.executable, "-m", "infsample_lab.bench.sampled_law", model_dir, drafts, str(samples),
                           "--seed", str(seed), *arm], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"sampled_law {drafts}: exit {proc.returncode}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().split("\n")[-1])


def z_scores(a: dict, b: dict) -> dict[str, float]:
    """For each (setting/prompt, statistic): the difference of the means of ``a`` and ``b`` in standard errors."""
    out = {}
    for key in a["samples"]:
        for stat, name in ((0, "length"), (1, "logprob")):
            x = [s[stat] for s in a["samples"][key]]
            y = [s[stat] for s in b["samples"][key]]
            mx, my = sum(x) / len(x), sum(y) / len(y)
            vx = sum((v - mx) ** 2 for v in x) / (len(x) - 1)
            vy = sum((v - my) ** 2 for v in y) / (len(y) - 1)
            out[f"{key}/{name}"] = (mx - my) / math.sqrt(vx / len(x) + vy / len(y) + 1e-12)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("drafts", choices=list(DRAFTS))
    p.add_argument("samples", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arm", action="append", default=[], help="a patches/ file to arm in this process")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of: {', '.join(SETTINGS)}")
    args = p.parse_args()
    settings = {name: SETTINGS[name] for name in args.settings.split(",")}
    if args.arm:
        from verl_infsample.integration.cpu import arm_patches

        for patch in args.arm:
            arm_patches(patch)

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from infsample_lab.models.tiny import model_prompts

    from verl_infsample.integration.settings import InfiniteRolloutSettings

    spec = InfiniteRolloutSettings(speculative="off" if args.drafts == "none" else args.drafts,
                                   speculative_tokens=4).speculative_config()
    llm = LLM(model=args.model, dtype="float32", gpu_memory_utilization=0.1, max_model_len=512, enforce_eager=True,
              seed=args.seed, max_num_seqs=64, speculative_config=spec, disable_log_stats=False)
    tok = AutoTokenizer.from_pretrained(args.model)
    eos = json.loads((Path(args.model) / "config.json").read_text())["eos_token_id"]
    texts = model_prompts(args.model, n=PROMPTS)
    ids = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for t in texts]
    out: dict = {"samples": {}}
    for name, setting in settings.items():
        requests, params = [], []
        for i, prompt in enumerate(ids):
            for j in range(args.samples):
                requests.append(TokensPrompt(prompt_token_ids=prompt))
                params.append(SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=[eos], logprobs=0,
                                             seed=args.seed * 1_000_003 + i * 10_007 + j, **setting))
        results = llm.generate(requests, params, use_tqdm=False)
        if name == "t1":
            recompute = [(list(r.outputs[0].token_ids), r.outputs[0].logprobs) for r in results[:RECOMPUTED]]
        for k, res in enumerate(results):
            o = res.outputs[0]
            lps = [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)]
            out["samples"].setdefault(f"{name}/{k // args.samples}", []).append(
                [len(o.token_ids), sum(lps) / max(1, len(lps))])
    greedy = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids],
                          SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=[eos], temperature=0.0), use_tqdm=False)
    out["greedy"] = [list(r.outputs[0].token_ids) for r in greedy]
    out["logprob_gap"] = _recomputed_gap(args.model, ids[0], recompute)
    if args.drafts == "group":
        from verl_infsample.drafter import pop_drafter_stats

        out["drafter"] = llm.collective_rpc(pop_drafter_stats)[0]
    counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    out["drafted"] = counters.get("vllm:spec_decode_num_draft_tokens", 0)
    out["accepted"] = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    print(json.dumps(out))


def _recomputed_gap(model_dir: str, prompt: list[int], samples) -> float:
    """The largest |vLLM's log-prob - transformers' log-prob| of the sampled tokens (temperature 1: both raw)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gap = 0.0
    for tokens, logprobs in samples:
        if not tokens:
            continue
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].float()
        ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        theirs = torch.tensor([lp[t].logprob for t, lp in zip(tokens, logprobs)])
        gap = max(gap, float((ours - theirs).abs().max()))
    return gap


if __name__ == "__main__":
    main()

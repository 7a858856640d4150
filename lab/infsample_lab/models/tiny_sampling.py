"""Sampling a tiny model's response lengths: held-out prompts of its corpus, responses, histograms, the eos bias.

Imports torch / transformers / matplotlib inside the functions only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from ..tasks.chains import guess_or_count
from .tiny_build import STAMP_FILE
from .tiny_corpus import TASKS, modes_example, synth_example
from .tiny_recipe import VARIANTS, check_variant
from .tiny_train import torch_threads


def default_prompts(n: int = 16, seed: int = 10_000, variant: str = "default") -> list[str]:
    """Held-out prompts (another seed than the training corpus), every kind in turn, for sampling and histograms;
    ``variant="modes"``: prompts of the "modes" corpus."""
    rng = random.Random(seed)
    corpus = VARIANTS[check_variant(variant)].get("corpus")
    if corpus == "modes":
        return [modes_example(rng)[0] for _ in range(n)]
    if corpus == "learns":
        return [guess_or_count(rng)[0] for _ in range(n)]
    return [synth_example(rng, TASKS[i % len(TASKS)][0])[0] for i in range(n)]


def model_prompts(model_dir, n: int = 16, seed: int = 10_000) -> list[str]:
    """``default_prompts`` of the corpus ``model_dir`` was trained on (its stamp says; any other model: the
    default's)."""
    try:
        corpus = json.loads((Path(model_dir) / STAMP_FILE).read_text())["params"].get("corpus", "tasks")
    except (OSError, ValueError, KeyError):
        corpus = "tasks"
    return default_prompts(n, seed, variant=corpus if corpus in VARIANTS else "default")


def eos_bias_processor(eos_token_id, bias: float = 0.0):
    """A transformers ``LogitsProcessor`` adding ``bias`` to the eos logit(s): > 0 shortens answers, < 0 lengthens.

    ``bias`` is a plain attribute: change it between (or during) ``generate`` calls to move the length distribution.
    """
    from transformers import LogitsProcessor

    class EosBiasLogitsProcessor(LogitsProcessor):
        def __init__(self, ids, b):
            self.ids = [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]
            self.bias = float(b)

        def __call__(self, input_ids, scores):
            if not self.bias:
                return scores
            scores = scores.clone()
            scores[:, self.ids] += self.bias
            return scores

    return EosBiasLogitsProcessor(eos_token_id, bias)


def sample_responses(model_dir, prompts: list[str], *, max_new_tokens: int = 128, seed: int = 0,
                     temperature: float = 1.0, eos_bias: float = 0.0, do_sample: bool = True,
                     batch_size: int = 64, model=None, tokenizer=None, threads: int = 1) -> list[list[int]]:
    """Generated token ids per prompt (one response per entry; repeat a prompt for a group), eos included."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_dir)
    mdl = model if model is not None else AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tok.eos_token_id
    procs = LogitsProcessorList([eos_bias_processor(eos, eos_bias)] if eos_bias else [])
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in prompts]
    out: list[list[int]] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad(), torch_threads(threads):
        torch.manual_seed(seed)
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i:i + batch_size], return_tensors="pt", padding=True, padding_side="left",
                      add_special_tokens=False)
            kw = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=None) if do_sample else dict(
                do_sample=False, temperature=None, top_p=None, top_k=None)
            gen = mdl.generate(**enc, max_new_tokens=max_new_tokens, logits_processor=procs, eos_token_id=eos,
                               pad_token_id=tok.pad_token_id, **kw)
            for row in gen[:, enc["input_ids"].shape[1]:].tolist():
                out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out


def length_histogram(model_dir, prompts: list[str] | None = None, n: int = 64, max_new_tokens: int = 128,
                     seed: int = 0, *, temperature: float = 1.0, eos_bias: float = 0.0, model=None,
                     tokenizer=None, batch_size: int = 64) -> list[int]:
    """Sample ``n`` responses and return their lengths in tokens (eos counted; a capped one is ``max_new_tokens``).

    ``prompts`` default to ``default_prompts()`` (16, every task kind in turn); response ``i`` answers
    ``prompts[i % len(prompts)]``. Seeded: the same arguments give the same lengths. Pass ``model`` / ``tokenizer``
    to reuse loaded ones. For the README: ``plot_length_histogram(length_histogram(d), "lengths.png", 128)``.
    """
    prompts = list(prompts) if prompts else default_prompts()
    batch = [prompts[i % len(prompts)] for i in range(n)]
    return [len(r) for r in sample_responses(model_dir, batch, max_new_tokens=max_new_tokens, seed=seed,
                                             temperature=temperature, eos_bias=eos_bias, model=model,
                                             tokenizer=tokenizer, batch_size=batch_size)]


def plot_length_histogram(lengths: list[int], path, max_new_tokens: int | None = None, title: str | None = None):
    """A PNG histogram of response lengths (matplotlib, Agg backend); the cap, if given, is drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = max_new_tokens or max(lengths)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(lengths, bins=min(32, max(4, cap // 4)), range=(0, cap + 1), color="#4477aa", edgecolor="white")
    if max_new_tokens:
        ax.axvline(max_new_tokens, color="#cc3311", linestyle="--", linewidth=1, label=f"cap {max_new_tokens}")
        ax.legend()
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("responses")
    ax.set_title(title or f"tiny model: {len(lengths)} sampled responses")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)

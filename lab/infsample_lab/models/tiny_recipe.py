"""What a tiny-model build is made of: its parameters, the variants over them, and the fingerprint that names it.

The fingerprint hashes ``BUILD_VERSION`` and the resolved parameters only (no source file): cached folders are found
by it, so a change to the corpus, the tokenizer or the training recipe must bump ``BUILD_VERSION``.
"""

from __future__ import annotations

import hashlib
import json

from .tiny_corpus import CORPORA

# Bump when the corpus, the tokenizer, the training recipe or the folder layout changes: cached models rebuild.
BUILD_VERSION = 1

DEFAULT_VOCAB = 1024
DEFAULT_TRAIN_STEPS = 1000
HEAD_DIM = 64  # some engines' attention kernels need head_dim >= 64

# The default build: what ``tiny_model_path`` caches, and what its fingerprint covers.
DEFAULTS: dict = dict(layers=2, hidden=128, heads=2, kv_heads=1, vocab=DEFAULT_VOCAB, seed=0,
                      train_steps=DEFAULT_TRAIN_STEPS, intermediate=None, corpus_size=6000, lr=3e-3,
                      batch_tokens=256, max_seq_len=160, max_position_embeddings=4096)
# Variants: build parameters over DEFAULTS. "modes": same size, tokenizer code and recipe, on the "modes" corpus
# (its first tokens tell the length), trained until it draws its modes about as the corpus weighs them, so that its
# openings predict its lengths (fewer steps leave it following its modes too loosely for any predictor to rank them;
# the step counts tried: docs/results.md). ``corpus`` enters the fingerprint only when it is not the default's.
MODES_TRAIN_STEPS = 8000
# "modes-quick": the same, trained 3000 steps, for the tests: its modes drawn off the corpus's weights, but its
# openings already tell its lengths (the learned predictor at k=8: Kendall tau 0.63-0.75 over seeds 0-2, history 0)
MODES_QUICK_TRAIN_STEPS = 3000
# "learns": the demo's model (``tasks.chains.guess_or_count``): guesses or counts, and only counting is reliably right.
LEARNS_TRAIN_STEPS = 6000
# "tools": calls a calculator (``tiny_tools_corpus``); its conversations (the tools' system turn included) are about
# 220 tokens, so sequences and batches are longer (the system turn, the same in every row, runs once a batch).
TOOLS_TRAIN_STEPS = 1500
VARIANTS: dict = {"default": {}, "modes": dict(corpus="modes", train_steps=MODES_TRAIN_STEPS),
                  "modes-quick": dict(corpus="modes", train_steps=MODES_QUICK_TRAIN_STEPS),
                  "learns": dict(corpus="learns", train_steps=LEARNS_TRAIN_STEPS),
                  "tools": dict(corpus="tools", train_steps=TOOLS_TRAIN_STEPS, heads=4, max_seq_len=256,
                                batch_tokens=4096)}


def check_variant(variant: str) -> str:
    """``variant``, if it is one of ``VARIANTS``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny-model variant {variant!r}: one of {', '.join(VARIANTS)}")
    return variant


def variant_params(variant: str) -> dict:
    """The build parameters of ``variant``: ``DEFAULTS`` with the variant's own over them."""
    return {**DEFAULTS, **VARIANTS[check_variant(variant)]}


def resolve(params: dict) -> dict:
    """``params`` over ``DEFAULTS``, checked, with ``intermediate`` filled in: every parameter a build uses."""
    p = {**DEFAULTS, "corpus": "tasks", **{k: v for k, v in params.items() if v is not None}}
    unknown = set(p) - set(DEFAULTS) - {"corpus"}
    if unknown:
        raise ValueError(f"unknown build parameter(s): {', '.join(sorted(unknown))}")
    if p["corpus"] not in CORPORA:
        raise ValueError(f"corpus must be one of {', '.join(CORPORA)}, got {p['corpus']!r}")
    for k in ("layers", "hidden", "heads", "kv_heads", "vocab", "corpus_size", "batch_tokens", "max_seq_len"):
        if int(p[k]) < 1:
            raise ValueError(f"{k} must be >= 1, got {p[k]}")
    if int(p["train_steps"]) < 0:
        raise ValueError(f"train_steps must be >= 0, got {p['train_steps']}")
    if p["heads"] % p["kv_heads"]:
        raise ValueError(f"heads ({p['heads']}) must be a multiple of kv_heads ({p['kv_heads']})")
    if p["vocab"] < 300:
        raise ValueError(f"vocab must be >= 300 (256 bytes + special tokens + merges), got {p['vocab']}")
    p["intermediate"] = int(p["intermediate"] or p["hidden"])
    return p


def fingerprint(params: dict | None = None) -> str:
    """A hash of the build: BUILD_VERSION plus every resolved parameter. Same fingerprint, same model."""
    p = resolve(params or {})
    if p["corpus"] == "tasks":  # the default corpus stays out of the hash: the default build's key is its size alone
        del p["corpus"]
    blob = json.dumps({"build_version": BUILD_VERSION, **p}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()

"""Building a tiny-model folder, and the cache of the variants' builds that ``tiny_model_path`` finds by fingerprint.

Imports torch / transformers inside the functions only.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..paths import REPO
from .tiny_corpus import synth_corpus
from .tiny_recipe import BUILD_VERSION, HEAD_DIM, fingerprint, resolve, variant_params
from .tiny_tokenizer import (CHAT_TEMPLATE, ENDOFTEXT, IM_END, IM_START, TOKENIZER_RECIPES, TokenizerRecipe,
                             train_tokenizer, wrap_tokenizer)
from .tiny_train import as_dialogue, encode_corpus, torch_threads, train

STAMP_FILE = "tiny_model.json"  # in every built folder: the build's parameters, fingerprint and weights' hash


def build_tiny_model(out_dir, *, layers: int = 2, hidden: int = 128, heads: int = 2, kv_heads: int = 1,
                     vocab: int | None = None, seed: int = 0, train_steps: int | None = None,
                     intermediate: int | None = None, corpus_size: int | None = None, lr: float | None = None,
                     batch_tokens: int | None = None, max_seq_len: int | None = None,
                     max_position_embeddings: int | None = None, corpus: str | None = None, threads: int = 1,
                     verbose: bool = False) -> Path:
    """Write a Qwen3 checkpoint folder (config, model.safetensors, generation_config, tokenizer) to ``out_dir``.

    ``vocab`` is the BPE vocabulary size to train (default 1024; the config's ``vocab_size`` is the tokenizer's
    length); ``train_steps`` the number of AdamW steps (0: random weights). Everything is seeded by ``seed``: the same
    arguments on the same machine give the same bytes. ``out_dir`` must be empty, absent, or an earlier build.

    Training runs on ``threads`` torch threads (restored afterwards). One is the default on purpose: the result then
    does not depend on the machine's core count, and on a busy 2-core machine two OpenMP threads spin-wait against
    other processes and run many times slower than one.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    p = resolve(dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab, seed=seed,
                     train_steps=train_steps, intermediate=intermediate, corpus_size=corpus_size, lr=lr,
                     batch_tokens=batch_tokens, max_seq_len=max_seq_len,
                     max_position_embeddings=max_position_embeddings, corpus=corpus))
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / STAMP_FILE).exists():
        raise ValueError(f"refusing to write a tiny model into non-empty {out} (not an earlier tiny-model build)")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    examples = [as_dialogue(e) for e in synth_corpus(p["corpus_size"], p["seed"], p["corpus"])]
    raw_tok = train_tokenizer(examples, p["vocab"], TOKENIZER_RECIPES.get(p["corpus"], TokenizerRecipe()))
    hf_tok = wrap_tokenizer(raw_tok, p["max_position_embeddings"])
    eos_id, pad_id = hf_tok.convert_tokens_to_ids(IM_END), hf_tok.convert_tokens_to_ids(ENDOFTEXT)
    encoded = encode_corpus(raw_tok, examples, p["max_seq_len"])
    t_tok = time.perf_counter()

    config = Qwen3Config(
        vocab_size=len(hf_tok), hidden_size=p["hidden"], intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"], num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
        head_dim=HEAD_DIM, max_position_embeddings=p["max_position_embeddings"], rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
        use_cache=True, attention_dropout=0.0, dtype="float32",
    )
    config.architectures = ["Qwen3ForCausalLM"]

    stats = {}
    with torch.random.fork_rng(devices=[]), torch_threads(threads):
        torch.manual_seed(p["seed"])
        model = Qwen3ForCausalLM(config).float()
        if p["train_steps"]:
            stats = train(model, encoded, p, verbose=verbose)
    t_train = time.perf_counter()
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True, temperature=1.0, top_p=1.0,
        max_new_tokens=128)

    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", STAMP_FILE):
        (out / name).unlink(missing_ok=True)
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    # Older transformers (4.x) and other loaders know the class by its 4.x name and read the template from here.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE,
              additional_special_tokens=[IM_START])
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    # The recipe is seeded, but training runs on this machine's float kernels: another CPU can end with other
    # weights (and other lengths). The weights' own hash names the build a measurement was made on.
    weights = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    stamp = {"build_version": BUILD_VERSION, "fingerprint": fingerprint(p), "weights_sha256": weights, "params": p,
             "build_seconds": round(time.perf_counter() - t0, 2), "tokenizer_seconds": round(t_tok - t0, 2),
             "train_seconds": round(t_train - t_tok, 2), "eos_token_id": eos_id, "pad_token_id": pad_id,
             "vocab_size": len(hf_tok), "n_params": sum(t.numel() for t in model.parameters()), **stats}
    (out / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")
    return out


def _default_cache_root(variant: str = "default") -> Path:
    """``.cache/tiny-model/`` for the default; a variant's own sibling, ``.cache/tiny-model-<variant>/``."""
    name = "tiny-model" if variant == "default" else f"tiny-model-{variant}"
    env = os.environ.get("INFSAMPLE_TINY_MODEL_CACHE")
    if env:
        return Path(env) if variant == "default" else Path(env) / name
    if (REPO / "pyproject.toml").exists():
        return REPO / ".cache" / name
    return Path.home() / ".cache" / "verl_infsample" / name


def _is_complete(folder: Path, fp: str) -> bool:
    """``folder`` holds a whole build of fingerprint ``fp``."""
    try:
        stamp = json.loads((folder / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("fingerprint") == fp and all(
        (folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"))


def tiny_model_path(cache_root=None, variant: str = "default") -> Path:
    """The default tiny model's folder, built once (about 40 s of one CPU core) and cached.

    The cache is ``<repo>/.cache/tiny-model/`` (or ``$INFSAMPLE_TINY_MODEL_CACHE``, or ``cache_root``); the folder
    is named by the build's fingerprint, so a change of defaults or of ``BUILD_VERSION`` builds a new one. The build
    goes to a temporary folder that is renamed into place when complete, so a half-built model is never used.
    ``variant="modes"``: the model whose first tokens tell the length (``.cache/tiny-model-modes/``); the other
    variants likewise (``VARIANTS``).
    """
    params = variant_params(variant)
    root = Path(cache_root) if cache_root is not None else _default_cache_root(variant)
    fp = fingerprint(params)
    final = root / (f"qwen3-tiny-{fp[:12]}" if variant == "default" else f"qwen3-tiny-{variant}-{fp[:12]}")
    if _is_complete(final, fp):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time: a concurrent caller waits, then finds it built
        if _is_complete(final, fp):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        tmp.chmod(0o755)
        try:
            build_tiny_model(tmp, **params)
            if final.exists():  # a stale or broken folder is in the way
                shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final

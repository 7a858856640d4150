"""``infsample make-tiny-model DIR [...]``: build a tiny-model folder from the command line."""

from __future__ import annotations

import json
import sys
import time

from .tiny_build import STAMP_FILE, build_tiny_model
from .tiny_recipe import DEFAULTS, HEAD_DIM, MODES_TRAIN_STEPS, VARIANTS


def add_make_tiny_model_parser(subparsers):
    """Register ``make-tiny-model DIR [...]`` on an argparse ``add_subparsers()`` object."""
    p = subparsers.add_parser("make-tiny-model", help="build the tiny offline Qwen3 model used by tests and demos",
                              description="Train a byte-level BPE tokenizer and a tiny Qwen3 model on a synthetic "
                                          "chat corpus (CPU, seconds) and write a Hugging Face folder to DIR.")
    p.add_argument("dir", help="output folder (absent, empty, or an earlier tiny-model build)")
    p.add_argument("--layers", type=int, default=DEFAULTS["layers"])
    p.add_argument("--hidden", type=int, default=DEFAULTS["hidden"])
    p.add_argument("--heads", type=int, default=DEFAULTS["heads"], help=f"attention heads (head_dim is {HEAD_DIM})")
    p.add_argument("--kv-heads", type=int, default=DEFAULTS["kv_heads"])
    p.add_argument("--vocab", type=int, default=DEFAULTS["vocab"], help="BPE vocabulary size to train")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--train-steps", type=int, default=None,
                   help=f"0: random weights (default {DEFAULTS['train_steps']}; --variant modes: {MODES_TRAIN_STEPS})")
    p.add_argument("--variant", choices=list(VARIANTS), default="default",
                   help="modes: trained on answers whose first tokens tell their length (direct / count / step); "
                        "learns: the demo's model; tools: calls a calculator")
    p.set_defaults(func=cmd_make_tiny_model)
    return p


def cmd_make_tiny_model(args) -> int:
    t0 = time.perf_counter()
    variant = {**VARIANTS[args.variant]}
    if args.train_steps is not None:
        variant["train_steps"] = args.train_steps
    out = build_tiny_model(args.dir, layers=args.layers, hidden=args.hidden, heads=args.heads,
                           kv_heads=args.kv_heads, vocab=args.vocab, seed=args.seed, verbose=True, **variant)
    stamp = json.loads((out / STAMP_FILE).read_text())
    print(f"tiny model: {stamp['n_params']:,} parameters, vocab {stamp['vocab_size']}, "
          f"loss {stamp.get('final_loss', 'n/a')}, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out)
    return 0

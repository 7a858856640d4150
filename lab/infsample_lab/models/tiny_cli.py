"""``infsample make-tiny-model DIR [...]``: build a tiny-model folder from the command line."""

from __future__ import annotations

import json
import sys
import time

from .tiny_build import STAMP_FILE, build_tiny_model
from .tiny_recipe import DEFAULTS, HEAD_DIM, VARIANTS


def add_make_tiny_model_parser(subparsers):
    """Register ``make-tiny-model DIR [...]`` on an argparse ``add_subparsers()`` object."""
    p = subparsers.add_parser("make-tiny-model", help="build the tiny offline Qwen3 model used by tests and demos",
                              description="Train a byte-level BPE tokenizer and a tiny Qwen3 model on a synthetic "
                                          "chat corpus (CPU, seconds) and write a Hugging Face folder to DIR.")
    p.add_argument("dir", help="output folder (absent, empty, or an earlier tiny-model build)")
    # no defaults here: a flag given overrides the variant's own build parameters (``VARIANTS``), which override
    # ``DEFAULTS``
    p.add_argument("--layers", type=int, help=f"default {DEFAULTS['layers']}")
    p.add_argument("--hidden", type=int, help=f"default {DEFAULTS['hidden']}")
    p.add_argument("--heads", type=int, help=f"attention heads (head_dim is {HEAD_DIM}; default {DEFAULTS['heads']}, "
                                             f"--variant tools: {VARIANTS['tools']['heads']})")
    p.add_argument("--kv-heads", type=int, help=f"default {DEFAULTS['kv_heads']}")
    p.add_argument("--vocab", type=int, help=f"BPE vocabulary size to train (default {DEFAULTS['vocab']})")
    p.add_argument("--seed", type=int, help=f"default {DEFAULTS['seed']}")
    p.add_argument("--train-steps", type=int,
                   help="0: random weights (default: the variant's, " + ", ".join(
                       f"{name} {params.get('train_steps', DEFAULTS['train_steps'])}"
                       for name, params in VARIANTS.items()) + ")")
    p.add_argument("--variant", choices=list(VARIANTS), default="default",
                   help="modes: trained on answers whose first tokens tell their length (direct / count / step); "
                        "learns: the demo's model; tools: calls a calculator")
    p.set_defaults(func=cmd_make_tiny_model)
    return p


def cmd_make_tiny_model(args) -> int:
    t0 = time.perf_counter()
    flags = dict(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads, vocab=args.vocab,
                 seed=args.seed, train_steps=args.train_steps)
    params = {**VARIANTS[args.variant], **{k: v for k, v in flags.items() if v is not None}}
    out = build_tiny_model(args.dir, verbose=True, **params)
    stamp = json.loads((out / STAMP_FILE).read_text())
    print(f"tiny model: {stamp['n_params']:,} parameters, vocab {stamp['vocab_size']}, "
          f"loss {stamp.get('final_loss', 'n/a')}, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out)
    return 0

"""GSM8K to verl parquet, like verl's examples/data_preprocess/gsm8k.py: OUT_DIR/train.parquet and test.parquet.

    python examples/gsm8k/preprocess.py --local_save_dir ~/data/gsm8k           # openai/gsm8k from the Hub
    python examples/gsm8k/preprocess.py --local_dataset_path /data/gsm8k ...    # a local copy of the dataset
    python examples/gsm8k/preprocess.py --local_save_dir DIR --offline-sample 256   # no network: generated sample

Rows: data_source "openai/gsm8k", the question + 'Let's think step by step and output the final answer after
"####".', reward_model.ground_truth = the number after "####". verl scores them with its own
verl.utils.reward_score.gsm8k.compute_score (default_compute_score picks it for openai/gsm8k); no custom reward
function is needed.

--offline-sample N writes N train and N test problems that this project generates (templated grade-school
arithmetic word problems with worked, calculator-annotated solutions ending in "#### <answer>"); it never touches
the network. Without it, an unreachable Hub is one clear error (exit status 2) naming this option.
"""

from __future__ import annotations

import argparse
import os
import sys

from infsample_lab.tasks import write_parquet
from infsample_lab.tasks.gsm8k import GSM8KUnavailable, load_gsm8k, sample_splits, to_verl_rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--local_save_dir", "--out-dir", dest="out_dir", default="~/data/gsm8k",
                   help="folder for train.parquet and test.parquet (default ~/data/gsm8k)")
    p.add_argument("--local_dataset_path", default=None, help="a local copy of openai/gsm8k instead of the Hub")
    p.add_argument("--offline-sample", type=int, default=None, metavar="N",
                   help="no network: write N generated GSM8K-format train problems and N test problems")
    p.add_argument("--seed", type=int, default=0, help="seed of --offline-sample (default 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out_dir = os.path.expanduser(args.out_dir)
    if args.offline_sample is not None:
        if args.offline_sample < 1:
            parser.error("--offline-sample must be >= 1")
        train, test = sample_splits(args.offline_sample, args.offline_sample, seed=args.seed)
        what = "generated GSM8K-format"
    else:
        try:
            train, test = load_gsm8k(args.local_dataset_path)
        except GSM8KUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        what = "openai/gsm8k"
    for split, examples in (("train", train), ("test", test)):
        rows = to_verl_rows(examples, split)
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet(rows, path)
        print(f"wrote {len(rows)} {what} {split} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

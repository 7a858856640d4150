"""Write knights-and-knaves puzzles as verl parquet files: OUT_DIR/train.parquet and OUT_DIR/test.parquet.

    python examples/logic_puzzles/prepare_data.py --out-dir ~/data/knights_knaves \
        --train 5000 --test 500 --min-people 2 --max-people 8 --seed 0

Difficulty = number of inhabitants, cycling evenly over [--min-people, --max-people]. Every puzzle has exactly one
solution; train and test come from independent seeded streams and share no puzzle. Rows follow verl's
examples/data_preprocess layout (data_source "knights_knaves"); score them with examples/logic_puzzles/reward.py:

    reward.custom_reward_function.path=examples/logic_puzzles/reward.py reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import argparse
import os
import sys

from infsample_lab.tasks import write_parquet
from infsample_lab.tasks.knights_knaves import MAX_PEOPLE, MIN_PEOPLE, NAMES, make_splits, to_verl_rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True, help="folder for train.parquet and test.parquet")
    p.add_argument("--train", type=int, default=5000, help="number of training puzzles (default 5000)")
    p.add_argument("--test", type=int, default=500, help="number of test puzzles (default 500)")
    p.add_argument("--min-people", type=int, default=MIN_PEOPLE, help=f"easiest puzzle size (default {MIN_PEOPLE})")
    p.add_argument("--max-people", type=int, default=MAX_PEOPLE, help=f"hardest puzzle size (default {MAX_PEOPLE})")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.train < 1 or args.test < 1:
        parser.error("--train and --test must be >= 1")
    if not MIN_PEOPLE <= args.min_people <= args.max_people <= len(NAMES):
        parser.error(f"need {MIN_PEOPLE} <= --min-people <= --max-people <= {len(NAMES)}")
    if args.max_people > 16:
        print(f"note: solving needs 2^{args.max_people} assignments per candidate puzzle; this may be slow",
              file=sys.stderr)
    train, test = make_splits(args.train, args.test, args.min_people, args.max_people, args.seed)
    out_dir = os.path.expanduser(args.out_dir)
    for split, puzzles in (("train", train), ("test", test)):
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet(to_verl_rows(puzzles, split), path)
        print(f"wrote {len(puzzles)} {split} puzzles ({args.min_people}..{args.max_people} people) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write chain-arithmetic prompts ("add 41 and 7", "what is 5 times 3", "count to 9") as verl parquet files.

    python examples/chains/prepare_data.py --out-dir /tmp/chains --train 512 --test 64 --seed 0

Score them with examples/chains/reward.py (1.0 for the right final answer, else 0.0).
"""

from __future__ import annotations

import argparse
import os
import sys

from infsample_lab.tasks import write_parquet
from infsample_lab.tasks.chains import make_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True, help="folder for train.parquet and test.parquet")
    p.add_argument("--train", type=int, default=512)
    p.add_argument("--test", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.train < 1 or args.test < 1:
        p.error("--train and --test must be >= 1")
    out_dir = os.path.expanduser(args.out_dir)
    for split, count, seed in (("train", args.train, args.seed), ("test", args.test, args.seed + 1)):
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet(make_rows(count, seed, split), path)
        print(f"wrote {count} {split} prompts to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write arithmetic questions for a tool agent ("add 41 and 17") as verl parquet files.

    python examples/tools/prepare_data.py --out-dir /tmp/tools --train 256 --test 32 --seed 0

Each row runs verl's ToolAgentLoop (``agent_name: tool_agent``) and hands the calculator tool its ground truth
(``extra_info.tools_kwargs.calculator.create_kwargs``). Score them with examples/tools/reward.py.
"""

from __future__ import annotations

import argparse
import os
import sys

from infsample_lab.tasks import write_parquet
from infsample_lab.tasks.tool_arithmetic import make_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True, help="folder for train.parquet and test.parquet")
    p.add_argument("--train", type=int, default=256)
    p.add_argument("--test", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.train < 1 or args.test < 1:
        p.error("--train and --test must be >= 1")
    out_dir = os.path.expanduser(args.out_dir)
    for split, count, seed in (("train", args.train, args.seed), ("test", args.test, args.seed + 1)):
        path = os.path.join(out_dir, f"{split}.parquet")
        write_parquet(make_rows(count, seed, split), path)
        print(f"wrote {count} {split} questions to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

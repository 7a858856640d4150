"""Multi-sample text from a tree-of-thought-llm log (princeton-nlp/tree-of-thought-llm, MIT) for ``infsample
eval-drafter``, ``trace from-text`` and ``scripts/drafts_table.py --text``: one prompt a line ({"prompt_id", "prompt",
"responses"}), each puzzle's sampled answers (the log's ``ys``) as its responses.

    git clone https://github.com/princeton-nlp/tree-of-thought-llm TOT
    python scripts/tot_groups.py TOT/logs/game24/gpt-4_0.7_naive_cot_sample_100_start900_end1000.json \\
        --puzzles TOT/src/tot/data/24/24.csv --skip 24 --out GAME24.jsonl

``--skip 24`` leaves out the first 24 puzzles (those the drafters were tuned on); ``--puzzles`` (the game of 24's
CSV) gives each prompt its four numbers, else the prompt is the puzzle's index.
"""

import argparse
import csv
import json
from pathlib import Path


def tot_groups(log: Path, puzzles: Path | None = None, skip: int = 0) -> list[dict]:
    entries = json.loads(log.read_text(encoding="utf-8"))
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "idx" in e and "ys" in e for e in entries):
        raise SystemExit(f"{log}: not a tree-of-thought-llm log (a JSON list of objects with 'idx' and 'ys')")
    numbers = {}
    if puzzles is not None:
        with puzzles.open(newline="", encoding="utf-8") as f:
            numbers = {i: row["Puzzles"] for i, row in enumerate(csv.DictReader(f))}
    return [{"prompt_id": f"tot-{e['idx']}", "prompt": numbers.get(int(e["idx"]), f"puzzle {e['idx']}"),
             "responses": [str(y) for y in e["ys"]]} for e in entries[skip:]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path, help="a tree-of-thought-llm log: logs/<task>/<...>.json")
    p.add_argument("--puzzles", type=Path, help="the task's puzzles (src/tot/data/24/24.csv): each prompt's numbers")
    p.add_argument("--skip", type=int, default=0, help="leave out the log's first SKIP puzzles")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    rows = tot_groups(args.log, args.puzzles, args.skip)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} prompts, {sum(len(r['responses']) for r in rows)} responses -> {args.out}")


if __name__ == "__main__":
    main()

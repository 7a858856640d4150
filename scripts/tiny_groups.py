"""The tiny model's own multi-sample text for ``infsample eval-drafter``: G sampled responses (temperature 1) for
each of P held-out prompts, one prompt a line ({"prompt_id", "prompt", "responses"}).

    python scripts/tiny_groups.py --prompts 32 --group 16 --seed 0 --out /tmp/tiny_groups.jsonl
"""

import argparse
import json

from infsample_lab.models.tiny_build import tiny_model_path
from infsample_lab.models.tiny_sampling import model_prompts, sample_responses


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="default")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from transformers import AutoTokenizer

    model = str(tiny_model_path(variant=args.variant))
    tok = AutoTokenizer.from_pretrained(model)
    prompts = model_prompts(model, n=args.prompts, seed=20_000 + args.seed)
    ids = sample_responses(model, [q for q in prompts for _ in range(args.group)], max_new_tokens=args.max_new_tokens,
                           seed=args.seed, threads=2)
    with open(args.out, "w") as f:
        for i, q in enumerate(prompts):
            responses = [tok.decode(r, skip_special_tokens=True) for r in ids[i * args.group:(i + 1) * args.group]]
            f.write(json.dumps({"prompt_id": f"tiny-{args.seed}-{i}", "prompt": q, "responses": responses}) + "\n")


if __name__ == "__main__":
    main()

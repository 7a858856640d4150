"""``infsample trace from-verl DIR``: a trace from verl's rollout dumps (``trainer.rollout_data_dir``), so a user can
replay their own run.

verl writes one ``{global_step}.jsonl`` per training step, a line per sample with its decoded ``input`` (prompt)
and ``output`` (response), its ``step`` and, from the V1 trainer, its ``uid`` (``{prompt}_{rollout}_{output}``).
Lengths are in tokens, so the text is tokenized again with the run's tokenizer: special tokens were stripped when
verl decoded it, so a prompt counts without its chat template's special tokens and a response without its stop
token (both a few tokens short of what vLLM held). Samples of one prompt in one step form a group; a prompt keeps
its id across steps (its text), so history carries over as in training. The trace keeps each prompt's token ids
and each sample's opening (its first ``OPENING_TOKENS`` ids), so the replay's ``infinite`` can run the product's
``learned`` predictor on them as the server does after a probe; with ``keep_tokens`` each sample's whole response,
against which the replay verifies drafts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..core.trace import OPENING_TOKENS, TraceError, TracePrompt, json_lines


def trace_from_verl(dump_dir: str | Path, tokenizer_path: str, keep_tokens: bool = False) -> list[TracePrompt]:
    dump_dir = Path(dump_dir)
    files = sorted(dump_dir.glob("*.jsonl"), key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit()
                                                            else 0, p.stem))
    if not files:
        raise TraceError(f"{dump_dir}: no *.jsonl files; point at verl's trainer.rollout_data_dir")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(tokenizer_path)
    except (OSError, ValueError) as e:
        raise TraceError(f"--tokenizer {tokenizer_path}: cannot load a tokenizer there ({e})") from None
    groups: dict[tuple[int, str], list[tuple[int, ...]]] = {}  # (step, prompt) -> each sample's response ids
    prompts: dict[str, tuple[int, ...]] = {}
    for path in files:
        for where, obj in json_lines(path, "verl's rollout dump lines"):
            if not isinstance(obj, dict) or not isinstance(obj.get("input"), str) or not isinstance(
                    obj.get("output"), str):
                raise TraceError(f"{where}: expected verl's rollout dump line with string 'input' and 'output'")
            step = obj.get("step", int(path.stem) if path.stem.isdigit() else 0)
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                raise TraceError(f"{where}: 'step' must be an integer >= 0, got {step!r}")
            pid = "v" + hashlib.blake2b(obj["input"].encode(), digest_size=6).hexdigest()
            if pid not in prompts:
                prompts[pid] = tuple(tok(obj["input"], add_special_tokens=False)["input_ids"])
            response = tuple(tok(obj["output"], add_special_tokens=False)["input_ids"]) or (tok.eos_token_id or 0,)
            groups.setdefault((step, pid), []).append(response)
    steps = sorted({s for s, _ in groups})
    index = {s: i for i, s in enumerate(steps)}  # verl's steps start at 1; a trace's at 0
    return [TracePrompt(pid, len(prompts[pid]), tuple(len(r) for r in responses), prompt_tokens=prompts[pid],
                        tokens=tuple(responses) if keep_tokens else None,
                        openings=None if keep_tokens else tuple(r[:OPENING_TOKENS] for r in responses),
                        step=index[step])
            for (step, pid), responses in groups.items()]

"""Multi-sample text, one prompt a line: ``{"prompt_id", "prompt", "responses": [...]}``, tokenized.

What ``infsample eval-drafter`` measures drafters on, and what ``infsample trace from-text`` turns into a trace
whose samples keep their tokens (the replay verifies drafts against them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .trace import TracePrompt, json_lines


@dataclass
class PromptGroup:
    prompt_id: str
    prompt: list[int]
    responses: list[list[int]]


class WordTokenizer:
    """Whitespace-separated words as tokens, numbered as first seen (deterministic for a given file)."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]


def make_tokenizer(spec: str):
    """``words`` (:class:`WordTokenizer`) or a model folder's tokenizer (no special tokens added)."""
    if spec == "words":
        return WordTokenizer()
    if not Path(spec).is_dir():
        raise ValueError(f"--tokenizer {spec!r}: neither 'words' nor a model folder with a tokenizer")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec)
    return lambda text: tok.encode(text, add_special_tokens=False)


def load_groups(path: str | Path, tokenize) -> list[PromptGroup]:
    """The file's prompts, tokenized; empty responses are dropped, a prompt with none is skipped."""
    groups = []
    expected = '{"prompt_id", "prompt", "responses": [...]}'
    for where, row in json_lines(path, expected, error=ValueError):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object with prompt_id, prompt, responses")
        missing = [k for k in ("prompt_id", "prompt", "responses") if k not in row]
        if missing:
            raise ValueError(f"{where}: missing key {missing[0]!r}; each line needs prompt_id, prompt, responses")
        if not isinstance(row["responses"], list) or not all(isinstance(r, str) for r in row["responses"]):
            raise ValueError(f"{where}: responses must be a list of strings")
        responses = [t for t in (tokenize(r) for r in row["responses"]) if t]
        if responses:
            groups.append(PromptGroup(str(row["prompt_id"]), tokenize(str(row["prompt"])), responses))
    if not groups:
        raise ValueError(f"{path}: no prompt with a non-empty response")
    return groups


def trace_from_groups(groups: list[PromptGroup], history: int = 0) -> list[TracePrompt]:
    """A trace of ``groups`` with their tokens: each prompt's first ``history`` responses are step 0 (an earlier
    step's answers), the rest the next step (one step where ``history`` is 0)."""
    if history < 0:
        raise ValueError(f"--history {history}: must be >= 0")
    steps = [[], []]
    for g in groups:
        for step, responses in ((0, g.responses[:history]), (1 if history else 0, g.responses[history:])):
            if responses:
                steps[step].append(TracePrompt(g.prompt_id, len(g.prompt), tuple(map(len, responses)),
                                               prompt_tokens=tuple(g.prompt),
                                               tokens=tuple(tuple(r) for r in responses), step=step))
    prompts = steps[0] + steps[1]
    if not prompts:
        raise ValueError("no responses to make a trace of")
    return prompts

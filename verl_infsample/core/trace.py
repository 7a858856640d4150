"""Traces: one JSON line per prompt, ``{"prompt_id": "p0", "prompt_len": 120, "lengths": [..G ints..]}``.

A trace is what a rollout produced (or what ``synth`` draws): prompts with the true response lengths of their
samples. Simulators replay it; predictors learn from it.

Optional fields, for token-conditioned predictors (``infsample eval-predictor --trace``), all or some of:
``"prompt_tokens": [..prompt_len ids..]``, ``"tokens": [[..lengths[i] ids..] per sample]`` and, per sample and
token as ``tokens``, ``"logprobs"`` (of the drawn token), ``"entropies"`` (nats, of the distribution it was drawn
from) and ``"stop_logprobs"`` (log of the mass on the stop tokens; ``null`` for -inf); or, instead of the whole
``tokens``, ``"openings"``: each sample's first ids, ``OPENING_TOKENS`` at most (what ``trace from-verl`` keeps, and
what the replay's ``infinite`` needs to run a predictor that reads openings). Readers that know only the three
required fields ignore them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file, the line and the field."""


OPENING_TOKENS = 16  # the opening a trace keeps of each sample: a probe reads at most this many


@dataclass(frozen=True)
class TracePrompt:
    prompt_id: str
    prompt_len: int
    lengths: tuple[int, ...]
    prompt_tokens: tuple[int, ...] | None = None
    tokens: tuple[tuple[int, ...], ...] | None = None  # per sample, its generated ids (len == lengths[i])
    logprobs: tuple[tuple[float, ...], ...] | None = None  # per sample and token, like ``tokens``
    entropies: tuple[tuple[float, ...], ...] | None = None
    stop_logprobs: tuple[tuple[float, ...], ...] | None = None
    step: int = 0
    # per sample, its first generated ids (at most ``OPENING_TOKENS``, fewer where it ended sooner): what a predictor
    # that reads a sample's opening sees of it, where the whole of ``tokens`` was not kept (``trace from-verl``)
    openings: tuple[tuple[int, ...], ...] | None = None

    @property
    def group_size(self) -> int:
        return len(self.lengths)

    def opening(self, i: int) -> tuple[int, ...]:
        """Sample ``i``'s first generated ids as the trace knows them (empty where it does not)."""
        if self.tokens is not None:
            return self.tokens[i][:OPENING_TOKENS]
        return self.openings[i] if self.openings is not None else ()


def read_trace(path: str | Path) -> list[TracePrompt]:
    path = Path(path)
    prompts, seen = [], set()
    for where, obj in json_lines(path, '{"prompt_id": str, "prompt_len": int, "lengths": [int, ...]}'):
        prompts.append(_parse_prompt(obj, where))
        key = (prompts[-1].step, prompts[-1].prompt_id)
        if key in seen:
            raise TraceError(f"{where}: duplicate prompt_id {key[1]!r} in step {key[0]}")
        seen.add(key)
    if not prompts:
        raise TraceError(f"{path}: the trace has no prompts")
    return prompts


def json_lines(path: str | Path, expected: str, error: type[ValueError] = TraceError):
    """(``file:line``, parsed object) for each non-blank line of a JSON Lines file; a line that is not JSON raises
    ``error`` naming the file, the line and what was ``expected``.

    A record ends at a line feed only: real model text holds U+2028, U+0085 and other Unicode line breaks inside
    its strings, where a reader that breaks lines on every Unicode line break would cut the record in two.
    """
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); expected {expected}") from None
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}: not JSON ({e.msg}); expected {expected}") from None


def _parse_prompt(obj, where: str) -> TracePrompt:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in ("prompt_id", "prompt_len", "lengths"):
        if key not in obj:
            raise TraceError(f"{where}: missing field {key!r}")
    pid, plen, lengths = obj["prompt_id"], obj["prompt_len"], obj["lengths"]
    if not isinstance(pid, (str, int)) or isinstance(pid, bool):
        raise TraceError(f"{where}: 'prompt_id' must be a string")
    if not _is_int(plen) or plen < 0:
        raise TraceError(f"{where}: 'prompt_len' must be an integer >= 0, got {plen!r}")
    if not isinstance(lengths, list) or not lengths:
        raise TraceError(f"{where}: 'lengths' must be a non-empty list of integers")
    for i, n in enumerate(lengths):
        if not _is_int(n) or n < 1:
            raise TraceError(f"{where}: 'lengths'[{i}] must be an integer >= 1, got {n!r}")
    lengths = tuple(int(n) for n in lengths)
    step = obj.get("step", 0)
    if not _is_int(step) or step < 0:
        raise TraceError(f"{where}: 'step' must be an integer >= 0, got {step!r}")
    prompt_tokens = obj.get("prompt_tokens")
    if prompt_tokens is not None:
        if (not isinstance(prompt_tokens, list) or len(prompt_tokens) != plen
                or not all(_is_int(t) and t >= 0 for t in prompt_tokens)):
            raise TraceError(f"{where}: 'prompt_tokens' must be a list of prompt_len ({plen}) token ids >= 0")
        prompt_tokens = tuple(prompt_tokens)
    per_token = {}
    for key, is_id in (("tokens", True), ("logprobs", False), ("entropies", False), ("stop_logprobs", False)):
        rows = obj.get(key)
        if rows is None:
            continue
        if not isinstance(rows, list) or len(rows) != len(lengths):
            raise TraceError(f"{where}: '{key}' must be a list with one list per sample ({len(lengths)})")
        for i, (row, n) in enumerate(zip(rows, lengths)):
            ok = isinstance(row, list) and len(row) == n and all(
                (_is_int(t) and t >= 0) if is_id else (t is None or isinstance(t, (int, float))) for t in row)
            if not ok:
                what = "token ids >= 0" if is_id else "numbers"
                raise TraceError(f"{where}: '{key}'[{i}] must be a list of lengths[{i}] ({n}) {what}")
        per_token[key] = tuple(tuple(int(t) for t in row) if is_id else
                               tuple(-math.inf if t is None else float(t) for t in row) for row in rows)
    openings = obj.get("openings")
    if openings is not None:
        if not isinstance(openings, list) or len(openings) != len(lengths):
            raise TraceError(f"{where}: 'openings' must be a list with one list per sample ({len(lengths)})")
        for i, (row, n) in enumerate(zip(openings, lengths)):
            if not (isinstance(row, list) and len(row) == min(n, OPENING_TOKENS)
                    and all(_is_int(t) and t >= 0 for t in row)):
                raise TraceError(f"{where}: 'openings'[{i}] must be a list of min(lengths[{i}], {OPENING_TOKENS}) "
                                 f"({min(n, OPENING_TOKENS)}) token ids >= 0")
        per_token["openings"] = tuple(tuple(int(t) for t in row) for row in openings)
    return TracePrompt(str(pid), int(plen), lengths, prompt_tokens, **per_token, step=int(step))


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def write_trace(prompts: list[TracePrompt], path: str | Path) -> None:
    with open(path, "w") as f:
        for p in prompts:
            obj = {"prompt_id": p.prompt_id, "prompt_len": p.prompt_len, "lengths": list(p.lengths)}
            if p.step:
                obj["step"] = p.step
            if p.prompt_tokens is not None:
                obj["prompt_tokens"] = list(p.prompt_tokens)
            for key in ("tokens", "logprobs", "entropies", "stop_logprobs", "openings"):
                rows = getattr(p, key)
                if rows is not None:
                    obj[key] = [[None if isinstance(t, float) and math.isinf(t) else t for t in row] for row in rows]
            f.write(json.dumps(obj))
            f.write("\n")


def rollout_steps(prompts: list[TracePrompt]) -> list[list[TracePrompt]]:
    """The trace's rollouts, one list per ``step`` in increasing order, each in the trace's line order."""
    steps: dict[int, list[TracePrompt]] = {}
    for p in prompts:
        steps.setdefault(p.step, []).append(p)
    return [steps[k] for k in sorted(steps)]


DISTRIBUTIONS = ("lognormal", "bimodal")


def synth_trace(prompts: int, group_size: int, max_len: int, dist: str = "lognormal", seed: int = 0,
                prompt_len: tuple[int, int] = (60, 200)) -> list[TracePrompt]:
    """Synthetic rollout lengths shaped like GRPO rollouts of a reasoning model.

    ``lognormal``: each prompt draws a median length around 250 tokens (log-sd 0.6 across prompts); its samples
    scatter around that median with log-sd 0.45; everything is truncated at ``max_len``.
    ``bimodal``: the same, but about 12% of samples run away to ``max_len`` (answers that never stop).
    """
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown --dist {dist!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    if prompts < 1 or group_size < 1 or max_len < 1:
        raise ValueError("--prompts, --group-size and --max-len must all be >= 1")
    rng = np.random.default_rng(seed)
    out = []
    for p in range(prompts):
        median = 250.0 * np.exp(0.6 * rng.standard_normal())
        lengths = median * np.exp(0.45 * rng.standard_normal(group_size))
        if dist == "bimodal":
            lengths = np.where(rng.random(group_size) < 0.12, max_len, lengths)
        lengths = np.clip(np.round(lengths), 1, max_len).astype(int)
        plen = int(rng.integers(prompt_len[0], prompt_len[1] + 1))
        out.append(TracePrompt(f"p{p}", plen, tuple(int(x) for x in lengths)))
    return out


def synth_rl_trace(prompts: int, group_size: int, max_len: int, steps: int = 1, seed: int = 0,
                   median: float = 1500.0, prompt_sigma: float = 0.8, group_sigma: float = 0.6,
                   runaway: float = 0.04, growth: float = 0.1,
                   prompt_len: tuple[int, int] = (100, 600)) -> list[TracePrompt]:
    """Rollout lengths shaped like reasoning RL, over ``steps`` training steps that each revisit every prompt.

    A prompt's difficulty persists across steps: its median length is ``median`` x a lognormal factor (log-sd
    ``prompt_sigma``) drawn once; its samples scatter around it (log-sd ``group_sigma``); a share ``runaway`` of
    samples, more on hard prompts, never stop and run to the cap; everything is truncated at ``max_len`` (the mass at
    the cap); medians grow by ``growth`` per step (responses lengthen as training goes on).
    """
    if min(prompts, group_size, max_len, steps) < 1:
        raise ValueError("--prompts, --group-size, --max-len and --steps must all be >= 1")
    rng = np.random.default_rng(seed)
    difficulty = prompt_sigma * rng.standard_normal(prompts)
    plens = rng.integers(prompt_len[0], prompt_len[1] + 1, prompts)
    out = []
    for step in range(steps):
        for p in range(prompts):
            centre = median * (1.0 + growth * step) * np.exp(difficulty[p])
            lengths = centre * np.exp(group_sigma * rng.standard_normal(group_size))
            runs_away = rng.random(group_size) < runaway * np.exp(difficulty[p])
            lengths = np.clip(np.round(np.where(runs_away, max_len, lengths)), 1, max_len).astype(int)
            out.append(TracePrompt(f"p{p}", int(plens[p]), tuple(int(x) for x in lengths), step=step))
    return out

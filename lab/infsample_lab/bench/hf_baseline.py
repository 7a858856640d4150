"""What a user does without us: transformers ``generate``, either the whole group at once (``hf-full``,
``num_return_sequences=G``) or in sequential micro groups of M (``hf-micro``). Same model, prompts and sampling.

Their KV is the ``DynamicCache`` that ``generate`` grows: every row holds prompt + the longest response of its call
(finished rows keep decoding padding until the last one stops), so its bytes are read off the returned cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from verl_infsample.engines.sampling import SamplingParams


@dataclass
class HFRun:
    outputs: list[list[list[int]]]  # per prompt, per sample: generated token ids (up to and including a stop token)
    decode_steps: int  # forward passes of the decoding batch, summed over calls
    peak_kv_bytes: int
    wall_s: float
    kv_timeline: list[tuple[int, int]] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(len(o) for group in self.outputs for o in group)


def hf_generate(model, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams, *, micro: int | None = None,
                pad_token_id: int = 0) -> HFRun:
    """``micro=None``: one ``generate`` per prompt with all n sequences; else ceil(n / micro) calls of <= micro."""
    torch.manual_seed(params.seed)
    outputs, steps, peak, timeline = [], 0, 0, []
    t0 = time.perf_counter()
    for prompt in prompts:
        ids = torch.tensor([list(prompt)], device=model.device)
        group: list[list[int]] = []
        while len(group) < n:
            batch = min(n - len(group), micro or n)
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), num_return_sequences=batch, max_new_tokens=params.max_new_tokens,
                do_sample=params.temperature > 0, temperature=params.temperature or None,
                top_p=params.top_p if params.temperature > 0 else None,
                top_k=(params.top_k if params.top_k > 0 else None) if params.temperature > 0 else None,
                eos_token_id=list(params.stop_token_ids) or None, pad_token_id=pad_token_id,
                return_dict_in_generate=True)
            new = out.sequences[:, ids.shape[1]:].tolist()
            kv = _cache_bytes(out.past_key_values)
            timeline += [(steps, 0), (steps + len(new[0]), kv)]
            steps += len(new[0])
            peak = max(peak, kv)
            group.extend(_until_stop(row, params.stop_token_ids) for row in new)
        outputs.append(group)
    timeline.append((steps, 0))
    return HFRun(outputs, steps, peak, time.perf_counter() - t0, timeline)


def _until_stop(row: list[int], stop: tuple[int, ...]) -> list[int]:
    for i, token in enumerate(row):
        if token in stop:
            return row[: i + 1]
    return row


def _cache_bytes(cache) -> int:
    if cache is None:
        return 0
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total

"""``verl_infsample.drafter.GroupDrafter``: the drafter as vLLM's ``custom_class`` proposer, and every contact the
drafter has with vLLM (versions 0.24 and 0.32), each named once here and nowhere else:

    speculative_config={"method": "custom_class", "model": "verl_infsample.drafter.GroupDrafter",
                        "num_speculative_tokens": K}

1. **Its model runner.** vLLM builds the proposer inside ``GPUModelRunner.__init__`` and hands it only the
   ``VllmConfig``; the runner (its batch, its requests, its rejection sampler, its model) is found on the call stack
   (:func:`_building_runner`). The model's parameters on this worker price a verified token for the budget
   (``budget.VERIFY_S_PER_PARAM``), counted at the first proposal (the model is loaded after the proposer is built).
2. **A step's rows.** After sampling, vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)``;
   the rows' request ids and prompt lengths come from the runner's ``input_batch``. vLLM schedules synchronously
   with this proposer, so the wall time from one call to the next is a whole step's, which the budget learns from.
3. **What the server told of each request**: the ``extra_args`` of its sampling parameters (``hints``), read from the
   runner's ``requests``, which also holds rows out of the batch (preempted: they come back).
4. **The verdicts.** vLLM keeps the rejection sampler's output to itself; the drafter wraps the runner's
   ``rejection_sampler.forward`` once and keeps each step's draft ids and sampled tokens on the device, read at the
   next proposal: vLLM has synchronized on that step by then (its sampled tokens are on the host), so the reads wait
   on nothing; the drafter adds no device sync of its own.
5. **The law check's inputs**, taken in the same wrapper from the sampler's ``SpecDecodeMetadata`` and
   ``SamplingMetadata`` (the target logits of the draft positions) and each request's own sampling parameters.
6. **Which worker drafts.** An engine reads the drafts of its first tensor-parallel worker and sends every worker
   the drafts it scheduled; only that worker keeps trees, drafts and counts (:func:`drafts_read_here`).
7. **What the server's worker extension asks** through ``collective_rpc``: the figures (:func:`pop_drafter_stats`)
   and the law guard's stop (:func:`halt_drafter`), on ``worker.model_runner.drafter``.

The drafting itself (``drafting.Drafting``: trees, budget, source choice, law tally) knows none of vLLM's types.
Its trees live in the worker's memory, so weight syncs keep them (an answer of an older policy is still a draft).
"""

from __future__ import annotations

import sys
import time
from typing import Iterator, Mapping

import numpy as np

from .budget import VERIFY_S_PER_PARAM
from .drafting import Drafting, DrafterStats
from .hints import NO_HINTS, RowHints
from .law_guard import rows_to_check, target_probabilities

GREEDY_BELOW = 1e-5  # vLLM's sampling epsilon: a temperature under it is greedy


class GroupDrafter:
    def __init__(self, vllm_config, runner=None, *, read_here: bool | None = None):
        self.read_here = drafts_read_here() if read_here is None else read_here
        spec = vllm_config.speculative_config
        self.drafting = (Drafting(int(spec.num_speculative_tokens), int(vllm_config.model_config.max_model_len))
                         if self.read_here else None)
        self.halted = False  # drafts stopped for the rest of the run (``halt_drafter``)
        self.runner = runner or _building_runner()
        self._watched = None  # the rejection sampler whose verdicts we read
        self._unread = None  # the last verified step's verdicts, not yet read (``_read_verdicts``)
        self._last_call: float | None = None  # when vLLM last called ``propose``

    def load_model(self, *args, **kwargs) -> None:
        """No model: vLLM calls this for proposers that have one."""

    def pop_stats(self) -> DrafterStats | None:
        """The figures since the last call; None on a worker whose drafts vLLM does not read."""
        if not self.read_here:
            return None
        self._read_verdicts()  # between steps: the last one's verdicts count too
        return self.drafting.pop_stats()

    def propose(self, sampled_token_ids, num_tokens_no_spec=None, token_ids_cpu=None, slot_mappings=None):
        """vLLM's call, once a step after sampling (contact 2)."""
        if not self.read_here or self.halted:  # vLLM reads another worker's drafts, or drafts are off
            return [[] for _ in sampled_token_ids]
        if self.runner is None:
            raise RuntimeError("GroupDrafter found no vLLM model runner; build it as GroupDrafter(vllm_config, runner)")
        now = time.perf_counter()
        if self._last_call is None:
            self._price_tokens()
        else:
            self.drafting.step_took(now - self._last_call)
        self._last_call = now
        self._watch_sampler()
        self._read_verdicts()
        batch = self.runner.input_batch
        if num_tokens_no_spec is not None and token_ids_cpu is not None:
            batch = _StepRows(batch.req_ids, batch.num_prompt_tokens, num_tokens_no_spec, token_ids_cpu)
        return self.propose_batch(batch, sampled_token_ids, getattr(self.runner, "requests", {}))

    def propose_batch(self, batch, sampled_token_ids, requests=None) -> list[list[int]]:
        """One draft per row of ``batch`` (vLLM's ``InputBatch``, or one with its fields), ``requests``: vLLM's
        requests by id (contact 3)."""
        return self.drafting.propose_batch(batch, sampled_token_ids, _RequestHints(requests or {}))

    def _price_tokens(self) -> None:
        """Contact 1: a verified token's seconds from the parameters of the model on this worker."""
        model = self.runner.get_model() if hasattr(self.runner, "get_model") else getattr(self.runner, "model", None)
        if model is not None and hasattr(model, "parameters"):
            params = sum(p.numel() for p in model.parameters())
            self.drafting.planner.cost.token_s = VERIFY_S_PER_PARAM * params

    def _watch_sampler(self) -> None:
        """Contact 4: wrap the runner's rejection sampler (once) to read its verdicts; only real steps reach it from
        here on (vLLM's warm-up runs before the first proposal)."""
        sampler = getattr(self.runner, "rejection_sampler", None)
        if sampler is None or self._watched is sampler:
            return
        original = sampler.forward

        def forward(metadata, draft_probs, logits, sampling_metadata):
            law = self._law_inputs(metadata, logits, sampling_metadata)
            output = original(metadata, draft_probs, logits, sampling_metadata)
            self._unread = (list(self.runner.input_batch.req_ids), metadata.draft_token_ids,
                            list(metadata.num_draft_tokens), output.sampled_token_ids, law)
            return output

        sampler.forward = forward
        self._watched = sampler

    def _read_verdicts(self) -> None:
        """The last verified step's verdicts (``_watch_sampler``) into the drafting's records and law tally."""
        if self._unread is None:
            return
        req_ids, draft_ids, counts, sampled, law = self._unread
        self._unread = None
        drafts = draft_ids.tolist()
        per_row, at = [], 0
        for n in counts:
            per_row.append(drafts[at:at + n])
            at += n
        probabilities = None
        if law is not None:
            chosen, p = law
            p = p.cpu().tolist()
            probabilities, at = [None] * len(counts), 0
            for i in chosen:
                probabilities[i] = p[at:at + counts[i]]
                at += counts[i]
        self.drafting.verified(req_ids, per_row, sampled.tolist(), probabilities)

    def _law_inputs(self, metadata, logits, sampling_metadata):
        """Contact 5: (rows chosen, the target probabilities of their draft tokens, left on the device), computed
        apart from the sampler (``law_guard``), or None where the step is not checked or something else shapes the
        law for every row (greedy, penalties, allowed or banned tokens). Each row's parameters are read from its
        request on the host, not from the device."""
        import torch

        m = sampling_metadata
        if (m.all_greedy or m.temperature is None or not m.no_penalties or m.allowed_token_ids_mask is not None
                or m.bad_words_token_ids):
            return None
        counts = metadata.num_draft_tokens
        req_ids, requests = self.runner.input_batch.req_ids, getattr(self.runner, "requests", {})
        params: dict[int, tuple[float, int, float]] = {}

        def plain(i: int) -> bool:
            params[i] = _plain_sampling(requests.get(req_ids[i]), counts[i])
            return params[i] is not None

        chosen = rows_to_check(self.drafting.stats.steps, counts, plain)
        if not chosen:
            return None
        starts = np.concatenate([[0], np.cumsum(counts)])
        device = logits.device  # computed where the logits are: only the probabilities come back
        index = torch.tensor(np.concatenate([np.arange(starts[i], starts[i + 1]) for i in chosen]), device=device)
        repeats = [counts[i] for i in chosen]

        def per_token(column: int):
            return torch.tensor(np.repeat([params[i][column] for i in chosen], repeats), device=device)

        target = logits[metadata.target_logits_indices.to(device)[index]]
        return chosen, target_probabilities(target, per_token(0), per_token(1), per_token(2),
                                            metadata.draft_token_ids.to(device)[index].long())


class _StepRows:
    """A step's rows as vLLM hands them to ``propose``, with the request ids and prompt lengths of its batch."""

    def __init__(self, req_ids, num_prompt_tokens, num_tokens_no_spec, token_ids_cpu):
        self.req_ids, self.num_prompt_tokens = req_ids, num_prompt_tokens
        self.num_tokens_no_spec, self.token_ids_cpu = num_tokens_no_spec, token_ids_cpu


class _RequestHints(Mapping):
    """vLLM's requests by id, read as the server's hints (contact 3): every request the engine holds is a key."""

    def __init__(self, requests: Mapping):
        self._requests = requests

    def __getitem__(self, req_id: str) -> RowHints:
        params = getattr(self._requests[req_id], "sampling_params", None)
        return RowHints.read(getattr(params, "extra_args", None)) if params is not None else NO_HINTS

    def __contains__(self, req_id) -> bool:
        return req_id in self._requests

    def __iter__(self) -> Iterator[str]:
        return iter(self._requests)

    def __len__(self) -> int:
        return len(self._requests)


def _plain_sampling(request, drafted: int) -> tuple[float, int, float] | None:
    """(temperature, top_k, top_p) of a request whose draft positions are sampled from temperature, top-k and
    top-p alone; None where something else shapes them (greedy, a ``min_tokens`` the positions may still be under,
    a thinking budget) or the request is unknown."""
    params = getattr(request, "sampling_params", None)
    if params is None or params.temperature < GREEDY_BELOW:
        return None
    if params.min_tokens and len(getattr(request, "output_token_ids", ())) < params.min_tokens + drafted:
        return None
    if getattr(params, "thinking_token_budget", None) is not None:
        return None
    top_k = params.top_k if params.top_k and params.top_k > 0 else 0
    return float(params.temperature), int(top_k), float(params.top_p)


def drafts_read_here() -> bool:
    """Contact 6: whether vLLM reads this worker's drafts. An engine takes a step's drafts from the first worker of
    its tensor-parallel group (its executor's output rank) and sends every worker the drafts it scheduled; the other
    workers' drafts are never read. So only that worker keeps trees, drafts and counts: an engine's memory, time,
    figures and law tally are one worker's, whatever the tensor parallelism."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized
    except ImportError:
        return True
    return not model_parallel_is_initialized() or get_tensor_model_parallel_rank() == 0


def pop_drafter_stats(worker) -> dict | None:
    """Contact 7, run in a vLLM worker by ``collective_rpc``: its GroupDrafter's figures since the last call (None:
    none, or a worker whose drafts vLLM does not read)."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    stats = drafter.pop_stats() if isinstance(drafter, GroupDrafter) else None
    return stats.as_dict() if stats is not None else None


def halt_drafter(worker) -> None:
    """Contact 7, run in a vLLM worker by ``collective_rpc``: its GroupDrafter drafts nothing from now on (the law
    guard's ``off_drafts``); vLLM then verifies empty drafts, one token a step, as with drafts off."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if isinstance(drafter, GroupDrafter):
        drafter.halted = True


def _building_runner():
    """Contact 1: the vLLM model runner whose constructor is building this drafter (vLLM passes only the config)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if candidate is not None and hasattr(candidate, "speculative_config") and hasattr(candidate, "vllm_config"):
            return candidate
        frame = frame.f_back
    return None

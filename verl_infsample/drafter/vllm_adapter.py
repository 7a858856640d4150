"""``verl_infsample.spec.GroupDrafter``: vLLM's ``custom_class`` proposer that drafts from a sample's group.

    speculative_config={"method": "custom_class", "model": "verl_infsample.spec.GroupDrafter",
                        "num_speculative_tokens": K}

vLLM builds it in each worker with the ``VllmConfig`` and calls ``propose`` once per step, after sampling. It works
in plain vLLM too: there a request's group is the rows that share its prompt. verl's ``rollout.name=infinite``
server tells it more through each request's ``extra_args`` (:data:`GROUP_ARG`: the sample's group, the same for
its probe and its rest; :data:`PREDICTED_ARG`: its predicted length). Drafts come from ``trees.DraftTrees``, their
lengths from ``budget.DraftBudget``; the rejection sampler's own verdicts feed both the budget (each row's recent
acceptance) and ``law_guard`` (is the sampled law kept?). The trees live in the worker's memory, so weight syncs
keep them (an answer of an older policy is still only a draft).
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .budget import AcceptanceRecord, DraftBudget
from .law_guard import CHECK_EVERY, POSITIONS_PER_STEP, LawTally, target_probabilities
from .trees import DraftTrees

logger = logging.getLogger(__name__)
GROUP_ARG = "infsample_group"
PREDICTED_ARG = "infsample_predicted"
GREEDY_BELOW = 1e-5  # vLLM's sampling epsilon: a temperature under it is greedy
SYNC_EVERY = 8  # tokens a row that does not draft may run ahead of the trees before they take its new tokens


@dataclass
class DrafterStats:
    """What the drafter did since the last :meth:`GroupDrafter.pop_stats` (summed over steps)."""
    steps: int = 0
    rows: int = 0  # decoding rows seen
    proposing_rows: int = 0  # rows the budget let propose
    drafted: int = 0  # draft tokens verified
    accepted: int = 0
    from_group: int = 0  # drafts taken from the group's tree (the rest from the prompt or the run's tree)
    propose_s: float = 0.0
    drafting_s: float = 0.0  # of which spent on the rows that drafted (their trees brought up to date, the draft)
    law: LawTally = field(default_factory=LawTally)
    group_bytes: int = 0  # the group trees' (at the last pop)
    tree_bytes: int = 0  # every tree's, the run's and the groups' (bounded: ``trees.TREE_BYTES``)

    def as_dict(self) -> dict:
        return asdict(self)


def pop_drafter_stats(worker) -> dict | None:
    """Run in a vLLM worker by ``collective_rpc``: its GroupDrafter's figures since the last call (None: none, or a
    worker whose drafts vLLM does not read)."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    stats = drafter.pop_stats() if isinstance(drafter, GroupDrafter) else None
    return stats.as_dict() if stats is not None else None


def halt_drafter(worker) -> None:
    """Run in a vLLM worker by ``collective_rpc``: its GroupDrafter drafts nothing from now on (the law guard's
    ``off_drafts``); vLLM then verifies empty drafts, one token a step, as with drafts off."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    if isinstance(drafter, GroupDrafter):
        drafter.halted = True


def drafts_read_here() -> bool:
    """Whether vLLM reads this worker's drafts. An engine takes a step's drafts from one worker, the first of its
    tensor-parallel group (its executor's output rank), and sends every worker the drafts it scheduled; the other
    workers' drafts are never read. So only that worker keeps trees, drafts and counts: an engine's memory, time,
    figures and law tally are one worker's, whatever the tensor parallelism."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized
    except ImportError:
        return True
    return not model_parallel_is_initialized() or get_tensor_model_parallel_rank() == 0


class GroupDrafter:
    def __init__(self, vllm_config, runner=None, *, trees: DraftTrees | None = None, read_here: bool | None = None):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.read_here = drafts_read_here() if read_here is None else read_here
        self.budget = DraftBudget(max_tokens=self.k)
        self.acceptance = AcceptanceRecord(self.k)
        self.trees = (trees or DraftTrees()) if self.read_here else None
        self.halted = False  # drafts stopped for the rest of the run (``halt_drafter``)
        self.runner = runner or _building_runner()
        self.synced: dict[str, int] = {}  # tokens of each row the trees hold (its prompt and response so far)
        self.unsynced: dict[str, np.ndarray] = {}  # a row's tokens past ``synced`` (rows that did not draft)
        self.stats = DrafterStats()
        self._guarded = None  # the rejection sampler whose verdicts we read
        self._unread = None  # the last verified step's verdicts, not yet read (``_read_verdicts``)

    def load_model(self, *args, **kwargs) -> None:
        """No model: vLLM calls this for proposers that have one."""

    def pop_stats(self) -> DrafterStats | None:
        """The figures since the last call; None on a worker whose drafts vLLM does not read."""
        if not self.read_here:
            return None
        self._read_verdicts()  # between steps: the last one's verdicts count too
        self.stats.group_bytes, self.stats.tree_bytes = self.trees.group_memory(), self.trees.memory()
        stats, self.stats = self.stats, DrafterStats()
        return stats

    # vLLM's custom_class call: the batch's rows, without request ids (read from the runner's batch instead)
    def propose(self, sampled_token_ids, num_tokens_no_spec=None, token_ids_cpu=None, slot_mappings=None):
        if not self.read_here or self.halted:  # vLLM reads another worker's drafts, or drafts are off
            return [[] for _ in sampled_token_ids]
        if self.runner is None:
            raise RuntimeError("GroupDrafter found no vLLM model runner; build it as GroupDrafter(vllm_config, runner)")
        self._watch_sampler()
        self._read_verdicts()
        return self.propose_batch(self.runner.input_batch, sampled_token_ids, getattr(self.runner, "requests", {}))

    def propose_batch(self, batch, sampled_token_ids, requests=None) -> list[list[int]]:
        """One draft per row of ``batch`` (vLLM's ``InputBatch``, or any object with its ``req_ids``,
        ``num_prompt_tokens``, ``num_tokens_no_spec`` and ``token_ids_cpu``)."""
        start = time.perf_counter()
        requests = requests or {}
        decoding, caps = [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a partial prefill
                continue
            req_id = batch.req_ids[i]
            n = int(batch.num_tokens_no_spec[i])
            hints = _hints(requests.get(req_id))
            if req_id not in self.trees.active:
                p = int(batch.num_prompt_tokens[i])
                prompt = batch.token_ids_cpu[i, :p]
                self.trees.start(req_id, hints.get(GROUP_ARG) or _prompt_key(prompt), prompt)
                self.acceptance.forget(req_id)  # a request id used again starts afresh
                self.synced[req_id] = p
            predicted = hints.get(PREDICTED_ARG)
            cap = self.max_model_len - n - 1
            left = int(predicted) - (n - int(batch.num_prompt_tokens[i])) if predicted is not None else 0
            if left > 0:  # no further than its predicted end; one that outlived it is bounded by its room alone
                cap = min(cap, left)
            decoding.append(i)
            caps.append(cap)
        lengths = self.budget.plan([self.acceptance.row(batch.req_ids[i]) for i in decoding], caps,
                                   self.acceptance.depth)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        self.stats.rows += len(decoding)
        for i, k in zip(decoding, lengths):
            req_id, n = batch.req_ids[i], int(batch.num_tokens_no_spec[i])
            if k <= 0:  # the trees take its tokens in runs: siblings see them at most SYNC_EVERY tokens late
                if n - self.synced[req_id] >= SYNC_EVERY:
                    self.trees.extend(req_id, batch.token_ids_cpu[i, self.synced[req_id]:n])
                    self.synced[req_id] = n
                    self.unsynced.pop(req_id, None)
                elif n > self.synced[req_id]:  # kept until the next run, or for the trees when the row ends
                    self.unsynced[req_id] = batch.token_ids_cpu[i, self.synced[req_id]:n].copy()
                continue
            began = time.perf_counter()
            self.stats.proposing_rows += 1
            if n > self.synced[req_id]:
                self.trees.extend(req_id, batch.token_ids_cpu[i, self.synced[req_id]:n])
                self.synced[req_id] = n
                self.unsynced.pop(req_id, None)
            draft = self.trees.propose(req_id, batch.token_ids_cpu[i, max(0, n - self.trees.max_depth):n], k)
            self.stats.from_group += draft.source == "group"
            drafts[i] = draft.token_ids
            self.stats.drafting_s += time.perf_counter() - began
        seen = set(batch.req_ids[:len(sampled_token_ids)])
        for req_id in [r for r in self.trees.active if r not in seen]:
            if req_id in requests:  # preempted or not scheduled this step: it comes back, and goes on where it was
                continue
            tail = self.unsynced.pop(req_id, None)  # its last tokens, which the trees have not had yet
            if tail is not None:
                self.trees.extend(req_id, tail)
            self.trees.stop(req_id)
            self.acceptance.forget(req_id)
            self.synced.pop(req_id, None)
        self.stats.steps += 1
        self.stats.propose_s += time.perf_counter() - start
        return drafts

    def verified(self, req_ids, draft_token_ids: list[list[int]], output_token_ids, probabilities=None) -> None:
        """The rejection sampler's verdicts on a step's drafts: row i kept the leading draft tokens equal to its
        output. ``probabilities[i]`` (target probabilities of row i's draft tokens, or None) feed the law check."""
        s = self.stats
        accepted = self.acceptance.verified(req_ids, draft_token_ids, output_token_ids)
        for i, (draft, a) in enumerate(zip(draft_token_ids, accepted)):
            if not draft:
                continue
            s.drafted += len(draft)
            s.accepted += a
            self.trees.verified(req_ids[i], output_token_ids[i])
            p = probabilities[i] if probabilities is not None else None
            if p is not None:
                for j in range(min(a + 1, len(draft))):  # tested: up to and including the first rejection
                    s.law.add(j < a, float(p[j]))

    def _watch_sampler(self) -> None:
        """Wrap the runner's rejection sampler (once) to read its verdicts; only real steps reach it from here on
        (vLLM's warm-up runs before the first proposal)."""
        sampler = getattr(self.runner, "rejection_sampler", None)
        if sampler is None or self._guarded is sampler:
            return
        original = sampler.forward

        def forward(metadata, draft_probs, logits, sampling_metadata):
            law = self._law_inputs(metadata, logits, sampling_metadata)
            output = original(metadata, draft_probs, logits, sampling_metadata)
            # kept on the device: read at the step's proposal, once vLLM has its sampled tokens on the host anyway
            self._unread = (list(self.runner.input_batch.req_ids), metadata.draft_token_ids,
                            list(metadata.num_draft_tokens), output.sampled_token_ids, law)
            return output

        sampler.forward = forward
        self._guarded = sampler

    def _read_verdicts(self) -> None:
        """The last verified step's verdicts (``_watch_sampler``) into the acceptance records and the law check."""
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
        self.verified(req_ids, per_row, sampled.tolist(), probabilities)

    def _law_inputs(self, metadata, logits, sampling_metadata):
        """(rows chosen, the target probabilities of their draft tokens, left on the device): up to
        ``POSITIONS_PER_STEP`` draft tokens under each request's own parameters, computed apart from the sampler, one
        step in ``CHECK_EVERY`` (None elsewhere, and where something else shapes the law: greedy rows, penalties,
        allowed or banned tokens, a ``min_tokens`` not yet reached, a thinking budget). Each row's parameters are read
        from its request on the host, not from the device."""
        import torch

        m = sampling_metadata
        if (self.stats.steps % CHECK_EVERY or m.all_greedy or m.temperature is None or not m.no_penalties
                or m.allowed_token_ids_mask is not None or m.bad_words_token_ids):
            return None
        rows = len(metadata.num_draft_tokens)
        starts = np.concatenate([[0], np.cumsum(metadata.num_draft_tokens)])
        offset = (self.stats.steps * 7) % max(1, rows)  # a different share of rows each step
        req_ids, requests = self.runner.input_batch.req_ids, getattr(self.runner, "requests", {})
        chosen, budget, params = [], POSITIONS_PER_STEP, []
        for r in range(rows):
            i = (offset + r) % rows
            n = metadata.num_draft_tokens[i]
            p = _plain_sampling(requests.get(req_ids[i]), n)
            if n and budget >= n and p is not None:
                chosen.append(i)
                params.append(p)
                budget -= n
        if not chosen:
            return None
        device = logits.device  # computed where the logits are: only the probabilities come back
        index = torch.tensor(np.concatenate([np.arange(starts[i], starts[i + 1]) for i in chosen]), device=device)
        repeats = [metadata.num_draft_tokens[i] for i in chosen]

        def per_token(column: int):
            return torch.tensor(np.repeat([p[column] for p in params], repeats), device=device)

        target = logits[metadata.target_logits_indices.to(device)[index]]
        return chosen, target_probabilities(target, per_token(0), per_token(1), per_token(2),
                                            metadata.draft_token_ids.to(device)[index].long())


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


def _hints(request) -> dict:
    params = getattr(request, "sampling_params", None)
    return (getattr(params, "extra_args", None) or {}) if params is not None else {}


def _prompt_key(prompt: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(prompt, dtype=np.int64).tobytes(), digest_size=12).hexdigest()


def _building_runner():
    """The vLLM model runner whose constructor is building this drafter (vLLM passes only the config)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if candidate is not None and hasattr(candidate, "speculative_config") and hasattr(candidate, "vllm_config"):
            return candidate
        frame = frame.f_back
    return None

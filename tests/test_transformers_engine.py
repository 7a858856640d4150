"""The real engine on the tiny Qwen3 checkpoint: exact GRPO samples under every schedule, shared prompt KV,
exact memory accounting, and loud failures."""

import json

import numpy as np
import pytest
import torch

from verl_infsample.core import KVBudget, SlotPool
from verl_infsample.core.predictor import LengthPredictor
from verl_infsample.engines.sampling import SamplingParams

MAX_NEW = 48


def _tokens(res):
    return [[o.token_ids for o in g] for g in res.outputs]


def test_greedy_equals_hf_generate(tiny_engine, tiny_prompts):
    prompts, stop = tiny_prompts
    params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=stop)
    res = tiny_engine.rollout(prompts, 3, params, policy="infinite", capacity=SlotPool(4))
    model = tiny_engine.model
    for prompt, group in zip(prompts, res.outputs):
        ids = torch.tensor([prompt])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                             eos_token_id=list(stop), pad_token_id=stop[0])[0, len(prompt):].tolist()
        if stop[0] in ref:
            ref = ref[: ref.index(stop[0]) + 1]
        for out in group:
            assert out.token_ids == ref


@pytest.fixture(scope="module")
def reference(tiny_engine, tiny_prompts):
    prompts, stop = tiny_prompts
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=11)
    return params, tiny_engine.rollout(prompts, 8, params, policy="full")


@pytest.mark.parametrize("policy, capacity", [
    ("naive", SlotPool(3)), ("continuous", SlotPool(1)), ("continuous", SlotPool(5)), ("lpt", SlotPool(4)),
    ("infinite", SlotPool(2)), ("infinite", SlotPool(7)), ("infinite", KVBudget(700)), ("oracle", SlotPool(4)),
    ("infinite", KVBudget(700, max_running=3)),
])
def test_same_seed_same_samples_under_every_schedule(tiny_engine, tiny_prompts, reference, policy, capacity):
    prompts, _ = tiny_prompts
    params, full = reference
    truth = [[len(t) for t in g] for g in _tokens(full)]
    res = tiny_engine.rollout(prompts, 8, params, policy=policy, capacity=capacity,
                              true_lengths=truth if policy == "oracle" else None)
    assert _tokens(res) == _tokens(full)
    for a, b in zip(res.outputs, full.outputs):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=1e-5)
    if isinstance(capacity, KVBudget):  # the real paged allocation stays inside the token budget
        assert res.kv.peak_in_use_bytes <= capacity.tokens * res.kv.bytes_per_token
        if capacity.max_running is not None:  # and the budget's cap on samples decoding at once holds
            assert res.stats.peak_active <= capacity.max_running
    elif capacity.slots <= 3:  # far fewer slots than G: less KV than decoding the whole group at once
        assert res.kv.peak_in_use_bytes < full.kv.peak_in_use_bytes
    assert tiny_engine.pool.in_use == 0  # everything freed at the end


@pytest.mark.parametrize("policy, capacity", [("continuous", SlotPool(5)), ("infinite", KVBudget(700))])
def test_the_cascade_and_the_per_row_gather_decode_the_same_samples(tiny_engine, tiny_prompts, reference, policy,
                                                                      capacity, monkeypatch):
    """A decode step reads each group's prompt once (the cascade) only where the per-row copies it saves are large
    (``shares_prompt``); both ways give the reference's tokens, and the threshold picks the way (every step, or
    none, here)."""
    from verl_infsample.engines import shared_prefix, transformers_engine

    prompts, _ = tiny_prompts
    params, full = reference
    cascades = []
    real = transformers_engine.SharedPromptDecode

    def counted(*args, **kwargs):
        cascades.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers_engine, "SharedPromptDecode", counted)
    for threshold, expect_cascade in ((0, True), (10**9, False)):
        cascades.clear()
        monkeypatch.setattr(shared_prefix, "SHARE_PROMPT_TOKENS", threshold)
        res = tiny_engine.rollout(prompts, 8, params, policy=policy, capacity=capacity)
        assert _tokens(res) == _tokens(full)
        for a, b in zip(res.outputs, full.outputs):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=1e-5)
        steps_fed = res.stats.decode_steps - res.stats.recompute_steps
        assert (len(cascades) >= steps_fed // 2) if expect_cascade else not cascades


def test_samples_vary_and_depend_on_seed(tiny_engine, tiny_prompts, reference):
    prompts, stop = tiny_prompts
    params, full = reference
    tokens = _tokens(full)
    assert any(len({tuple(t) for t in group}) > 1 for group in tokens)  # real sampling, not copies
    lengths = [len(t) for g in tokens for t in g]
    assert len(set(lengths)) >= 4  # stop times spread: the scheduling is exercised
    other = tiny_engine.rollout(prompts, 8, SamplingParams(**{**params.__dict__, "seed": 12}), policy="full")
    assert _tokens(other) != tokens


def test_prompt_prefilled_once_per_group_and_kv_accounting_is_exact(tiny_engine, tiny_prompts):
    prompts, stop = tiny_prompts
    params = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=3)
    res = tiny_engine.rollout(prompts[:1], 16, params, policy="continuous", capacity=SlotPool(16))
    assert res.stats.prefill_passes == 1  # 16 samples, one prompt prefill
    pool = tiny_engine.pool
    bs = pool.block_size
    # all 16 start together: at decode step t the prompt's blocks, and every sample still decoding (one of length L
    # decodes until t = L - 1) holds the blocks of the t tokens it has fed
    lengths = [len(o.token_ids) for o in res.outputs[0]]
    step_by_step = max(-(-len(prompts[0]) // bs) + sum(-(-t // bs) for n in lengths if n - 1 >= t)
                       for t in range(max(lengths)))
    assert res.kv.peak_in_use_bytes == step_by_step * pool.bytes_per_block


def test_logprobs_match_a_full_forward(tiny_engine, tiny_prompts, reference):
    prompts, _ = tiny_prompts
    params, full = reference
    out = full.outputs[0][0]
    ids = torch.tensor([prompts[0] + out.token_ids])
    with torch.no_grad():
        logits = tiny_engine.model(ids).logits[0, len(prompts[0]) - 1: -1].double() / params.temperature
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    np.testing.assert_allclose(out.logprobs, expected.numpy(), atol=1e-4)


def test_preempted_samples_resume_exactly(tiny_engine, tiny_prompts, reference, monkeypatch):
    prompts, _ = tiny_prompts
    params, full = reference

    class Underpredict(LengthPredictor):
        name = "underpredict"

        def predict(self, group, sample):
            return 2.0

        def observe(self, group, sample, length):
            pass

    steps = []  # the engine's decoding steps
    step = tiny_engine.step
    monkeypatch.setattr(tiny_engine, "step", lambda sched: steps.append(1) or step(sched))
    budget = max(len(p) for p in prompts) + MAX_NEW + 40
    res = tiny_engine.rollout(prompts, 8, params, policy="infinite", capacity=KVBudget(budget),
                              predictor=Underpredict())
    assert res.stats.preemptions > 0 and res.stats.recompute_tokens > 0
    assert _tokens(res) == _tokens(full)
    # rebuilding a preempted sample's KV is a forward pass of its own: counted in decode_steps, not hidden
    assert 0 < res.stats.recompute_steps <= res.stats.preemptions
    assert res.stats.decode_steps == len(steps) + res.stats.recompute_steps


def test_bad_input_is_rejected(tiny_engine, tiny_prompts):
    prompts, stop = tiny_prompts
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(ValueError, match="slots"):
        SlotPool(0)
    too_long = [1] * (tiny_engine.max_positions - 4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tiny_engine.rollout([too_long], 2, SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="empty"):
        tiny_engine.rollout([[]], 2, SamplingParams(max_new_tokens=8))


def test_an_exception_in_a_step_fails_the_whole_rollout(tiny_engine, tiny_prompts, monkeypatch):
    prompts, stop = tiny_prompts
    calls = {"n": 0}
    real = tiny_engine._run  # every forward pass: prefill, recompute, decode

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 12:
            raise RuntimeError("device fell over")
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_engine, "_run", flaky)
    with pytest.raises(RuntimeError, match="device fell over"):
        tiny_engine.rollout(prompts, 4, SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=stop),
                            policy="infinite", capacity=SlotPool(3))
    assert tiny_engine.pool.in_use == 0


def test_sleep_mode_refuses_to_decode_until_everything_is_awake(tiny_model_dir, tiny_prompts, tiny_engine):
    """verl's rollout lifecycle: sleep frees the device (on a GPU the weights go to host memory); a rollout while any
    part sleeps is refused, and once woken the engine decodes what it decoded before. Without sleep mode, sleep is
    refused by name."""
    from verl_infsample.engines.transformers_engine import TransformersEngine

    prompts, stops = tiny_prompts
    params = SamplingParams(max_new_tokens=8, stop_token_ids=stops, seed=3)
    engine = TransformersEngine.from_pretrained(tiny_model_dir, enable_sleep_mode=True)
    before = engine.rollout(prompts[:2], 3, params).outputs
    engine.sleep()
    engine.wake_up(["weights"])  # verl: the weights first (the sync), then the KV
    with pytest.raises(RuntimeError, match=r"\['kv_cache'\] sleep: wake_up\(\) first"):
        engine.rollout(prompts[:2], 3, params)
    engine.wake_up(["kv_cache"])
    assert [[o.token_ids for o in g] for g in engine.rollout(prompts[:2], 3, params).outputs] == \
        [[o.token_ids for o in g] for g in before]
    with pytest.raises(ValueError, match="enable_sleep_mode"):
        tiny_engine.sleep()


def test_the_first_token_lookahead_keeps_the_tokens_and_fails_loudly(tiny_engine, tiny_prompts, monkeypatch):
    """With ``learned`` the engine draws every sample's first token before the plan (one prompt pass per group) and
    emits exactly that token when the sample starts, without drawing it again: the tokens are those of ``full``,
    and as many are drawn. A failure inside the lookahead fails the rollout and leaves no block held."""
    import dataclasses

    from verl_infsample.predict import make_predictor

    prompts, stop = tiny_prompts
    params = SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=5)
    full = tiny_engine.rollout(prompts, 6, params, policy="full")
    drawn, sampler = [], tiny_engine._sampling  # rows the sampler draws a token for, by the steps and the lookahead
    monkeypatch.setattr(tiny_engine, "_sampling", dataclasses.replace(
        sampler, tokens=lambda rows, p, rngs, **kw: drawn.append(len(rngs)) or sampler.tokens(rows, p, rngs, **kw),
        shared=lambda logits, p, rngs: drawn.append(len(rngs)) or sampler.shared(logits, p, rngs)))
    res = tiny_engine.rollout(prompts, 6, params, policy="infinite", capacity=SlotPool(3),
                              predictor=make_predictor("learned:k=8", max_len=MAX_NEW))
    assert res.stats.lookahead_prefills == len(prompts) and _tokens(res) == _tokens(full)
    assert sum(drawn) == sum(len(t) for g in _tokens(res) for t in g)
    plain = tiny_engine.rollout(prompts, 6, params, policy="infinite", capacity=SlotPool(3), predictor="history")
    assert _tokens(plain) == _tokens(full) and plain.stats.lookahead_prefills == 0

    def broken(group):
        tiny_engine._prompt_kv[group] = tiny_engine.pool.allocate(1)  # as the real one does before its forward
        raise RuntimeError("prompt pass failed")

    monkeypatch.setattr(tiny_engine, "_prefill_prompt", broken)
    with pytest.raises(RuntimeError, match="prompt pass failed"):
        tiny_engine.rollout(prompts, 6, params, policy="infinite", capacity=SlotPool(3),
                            predictor=make_predictor("learned:k=8", max_len=MAX_NEW))
    assert tiny_engine.pool.in_use == 0


def test_the_lookahead_prompt_pass_is_the_prefill_when_the_prompts_fit(tiny_engine, tiny_prompts, monkeypatch):
    """Under slots, with the batch's prompts within the plan's open-prompt allowance, the lookahead's prompt pass
    keeps its KV as the group's prefill: one pass per group, not two. Under a KV budget that holds every prompt, the
    groups the first admission opens keep theirs and the others' go (the scheduler accounts only open groups'
    prompts), and the real KV stays within the budget. When the prompts do not fit, every pass is freed and each
    group is prefilled again when it starts. The tokens are the same in all, and nothing stays held."""
    from verl_infsample.core.capacity import KVBudget
    from verl_infsample.predict import make_predictor

    prompts, stop = tiny_prompts
    params = SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=5)
    passes = {"n": 0}
    real = tiny_engine._prefill_prompt

    def counting(group):
        passes["n"] += 1
        return real(group)

    monkeypatch.setattr(tiny_engine, "_prefill_prompt", counting)

    admissions: list[set] = []
    real_prefill = tiny_engine.prefill

    def recording(sched, admitted):
        admissions.append({s.group for s in admitted})
        return real_prefill(sched, admitted)

    monkeypatch.setattr(tiny_engine, "prefill", recording)

    def run(capacity):
        passes["n"] = 0
        admissions.clear()
        res = tiny_engine.rollout(prompts, 6, params, policy="infinite", capacity=capacity,
                                  predictor=make_predictor("learned:k=8", max_len=MAX_NEW))
        assert tiny_engine.pool.in_use == 0
        return res, passes["n"], len(admissions[0])  # the groups the first admission opened

    tokens = 4 * (max(map(len, prompts)) + MAX_NEW)
    kept, kept_passes, _ = run(SlotPool(8))
    assert kept_passes == len(prompts)
    budget, budget_passes, opened = run(KVBudget(tokens))
    assert budget.kv.peak_in_use_bytes <= tokens * budget.kv.bytes_per_token
    monkeypatch.setattr(tiny_engine, "_keeps_lookahead_kv", lambda *args: False)  # the prompts do not fit
    freed, freed_passes, _ = run(SlotPool(8))
    assert freed_passes == 2 * len(prompts)
    budget_freed, budget_freed_passes, opened_again = run(KVBudget(tokens))
    # under the budget, the groups the first admission opened were prefilled by the lookahead: that many passes fewer
    assert opened == opened_again >= 1 and budget_freed_passes - budget_passes == opened
    assert _tokens(kept) == _tokens(budget) == _tokens(freed) == _tokens(budget_freed)


def test_the_device_sampler_keeps_every_schedule_exact(tiny_model_dir, tiny_prompts):
    """``sampler="torch"`` (what a GPU uses by default; here on the CPU) draws on the model's device with
    counter-based noise: other tokens than the numpy sampler's, but the same under every policy, slot count, KV
    budget and the first-token lookahead; greedy decoding is HF's ``generate`` as before."""
    from verl_infsample.predict import make_predictor
    from verl_infsample.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine.from_pretrained(tiny_model_dir, sampler="torch")
    host = TransformersEngine.from_pretrained(tiny_model_dir)
    prompts, stop = tiny_prompts
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=stop)
    assert _tokens(engine.rollout(prompts, 2, greedy, capacity=SlotPool(3))) == _tokens(
        host.rollout(prompts, 2, greedy, capacity=SlotPool(3)))
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=11)
    full = engine.rollout(prompts, 8, params, policy="full")
    assert _tokens(full) != _tokens(host.rollout(prompts, 8, params, policy="full"))  # another noise source
    truth = [[len(t) for t in g] for g in _tokens(full)]
    for policy, capacity, predictor in [("continuous", SlotPool(5), "none"), ("infinite", SlotPool(3), "history"),
                                        ("infinite", KVBudget(700), "history"), ("oracle", SlotPool(4), "none"),
                                        ("infinite", SlotPool(3), make_predictor("learned:k=8", max_len=MAX_NEW))]:
        res = engine.rollout(prompts, 8, params, policy=policy, capacity=capacity, predictor=predictor,
                             true_lengths=truth if policy == "oracle" else None)
        assert _tokens(res) == _tokens(full), (policy, capacity)
        for a, b in zip(res.outputs, full.outputs):
            for x, y in zip(a, b):
                np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=1e-5)
    lengths = [len(t) for g in _tokens(full) for t in g]
    assert len(set(lengths)) > 3  # the samples vary
    assert engine.pool.in_use == 0
    with pytest.raises(ValueError, match="sampler must be one of auto, numpy, torch"):
        TransformersEngine(engine.model, sampler="cuda")


@pytest.mark.parametrize("sampler", ["numpy", "torch"])
def test_drawing_in_row_chunks_changes_nothing_but_the_chunk_size(tiny_model_dir, tiny_prompts, monkeypatch,
                                                                  sampler):
    """A step draws its batch ``_SAMPLE_ROWS`` rows at a time, so the sampler's float64 [rows, vocab] temporaries
    stay bounded as the batch grows (``full`` at n=1024 on Qwen3's vocabulary: ~1.2 GB each otherwise). Chunks of 3
    rows give the same tokens, log-probs and checkpoint reports (entropy, stop mass) as one chunk of the batch, and
    the sampler never sees more than 3 rows."""
    import dataclasses

    from verl_infsample.predict import make_predictor
    from verl_infsample.engines import transformers_engine as te

    engine = te.TransformersEngine.from_pretrained(tiny_model_dir, sampler=sampler)
    prompts, stop = tiny_prompts
    params = SamplingParams(temperature=1.0, top_k=40, max_new_tokens=MAX_NEW, stop_token_ids=stop, seed=3)

    def run(rows):
        monkeypatch.setattr(te, "_SAMPLE_ROWS", rows)
        reports, widths = [], []
        sampling = engine._sampling

        def tokens(logits, *args, **kwargs):
            widths.append(len(logits))
            return sampling.tokens(logits, *args, **kwargs)

        def observe(sched, running, at, stats):
            reports.extend((running[i].uid, len(running[i].engine_state.tokens), h, sl)
                           for i, (h, sl) in zip(at, stats))

        monkeypatch.setattr(engine, "_sampling", dataclasses.replace(sampling, tokens=tokens))
        monkeypatch.setattr(engine, "_report_tokens", observe)
        try:  # a KV budget: the learned predictor is read at 1, 4 and k tokens; 2048 tokens keep ~40 rows running
            res = engine.rollout(prompts, 8, params, policy="infinite", capacity=KVBudget(2048),
                                 predictor=make_predictor("learned:k=8", max_len=MAX_NEW))
        finally:
            monkeypatch.setattr(engine, "_sampling", sampling)
        return res, reports, widths

    whole, whole_reports, whole_widths = run(64)
    chunked, chunked_reports, chunked_widths = run(3)
    assert max(whole_widths) > 3 and max(chunked_widths) == 3
    assert _tokens(chunked) == _tokens(whole)
    assert [o.logprobs for g in chunked.outputs for o in g] == [o.logprobs for g in whole.outputs for o in g]
    assert len(whole_reports) > 0 and sorted(chunked_reports) == sorted(whole_reports)
    assert {k for _, k, _, _ in whole_reports} >= {4, 8}


def test_bench_engine_json_contract_plot_and_warmed_predictors(tiny_model_dir, tiny_engine, tmp_path, capsys):
    """``infsample bench-engine``: one JSON object per policy with its fields, ours first (``full`` the reference),
    then HF ``generate``; our policies sample exactly ``full``'s tokens; the plot is
    written. ``learned`` is warmed by earlier rollouts at other seeds: the same tokens as with ``history``."""
    from verl_infsample.cli import main

    fields = {"policy", "decode_steps", "peak_kv_bytes", "wall_s", "tokens_per_s", "total_tokens",
              "identical_to_full", "sched_overhead", "step_overhead"}
    common = ["bench-engine", "--model", tiny_model_dir, "--prompts", "2", "--group-size", "4", "--slots", "2",
              "--max-new-tokens", "12", "--json"]
    plot = tmp_path / "kv.png"
    capsys.readouterr()
    assert main([*common, "--policy", "naive,infinite,hf-micro", "--plot", str(plot), "--repeat", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)  # (each row its faster round of two)
    assert [r["policy"] for r in rows] == ["naive", "infinite", "hf-micro"]
    assert all(fields <= set(r) for r in rows)
    assert rows[0]["identical_to_full"] and rows[1]["identical_to_full"]
    assert rows[0]["total_tokens"] == rows[1]["total_tokens"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert main([*common, "--policy", "infinite", "--predictor", "learned:k=4,min=4", "--warm-rollouts", "2"]) == 0
    learned = json.loads(capsys.readouterr().out)
    assert learned[0]["identical_to_full"] and learned[0]["total_tokens"] == rows[1]["total_tokens"]

    # under a KV budget with a cap of one sample decoding at a time, every step makes one token
    assert main([*common, "--policy", "infinite", "--kv-budget", "400", "--max-running", "1"]) == 0
    capped = json.loads(capsys.readouterr().out)[0]
    assert capped["identical_to_full"] and capped["decode_steps"] >= capped["total_tokens"] == rows[1]["total_tokens"]

    # --kv-share: a budget of that share of full's measured peak (whole blocks), set by full's run, which is the
    # reference; every policy stays within it
    assert main([*common, "--policy", "full,infinite,plain", "--kv-share", "0.5", "--max-running", "2"]) == 0
    shared = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    block_bytes = tiny_engine.pool.bytes_per_block
    budget_bytes = int(0.5 * shared["full"]["peak_kv_bytes"] // block_bytes) * block_bytes
    assert 0 < shared["infinite"]["peak_kv_bytes"] <= budget_bytes < shared["full"]["peak_kv_bytes"]
    assert shared["plain"]["peak_kv_bytes"] <= budget_bytes
    assert all(r["identical_to_full"] for r in shared.values())
    assert shared["infinite"]["total_tokens"] == rows[1]["total_tokens"]
    assert main([*common, "--kv-share", "0.01"]) == 2
    assert "--kv-share 0.01: " in (err := capsys.readouterr().err) and "raise --kv-share" in err
    assert main([*common, "--kv-share", "0.5", "--kv-budget", "400"]) == 2
    assert "not with --kv-budget" in capsys.readouterr().err
    assert main([*common, "--kv-share", "0"]) == 2
    assert "in (0, 1]" in capsys.readouterr().err

    assert main([*common, "--max-running", "2"]) == 2
    assert "give it with --kv-budget" in capsys.readouterr().err
    assert main([*common, "--predictor", "oracle"]) == 2
    assert "--predictor 'oracle'" in capsys.readouterr().err
    assert main([*common, "--warm-rollouts", "-1"]) == 2
    assert "--warm-rollouts must be >= 0" in capsys.readouterr().err
    assert main([*common, "--repeat", "0"]) == 2
    assert "--repeat must be >= 1" in capsys.readouterr().err

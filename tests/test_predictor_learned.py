"""The online token-conditioned length predictor (``learned``): protocol, persistence, sibling signal, the engine
hook, adaptation to a length shift on the real tiny model, and ``infsample eval-predictor``."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from verl_infsample.core.capacity import KVBudget, SlotPool
from verl_infsample.core.predictor import HistoryPredictor
from verl_infsample.predict import make_predictor
from verl_infsample.core.sample import Group, Sample
from verl_infsample.core.trace import TracePrompt, read_trace, synth_trace, write_trace
from verl_infsample.engines.simulated import simulate
from verl_infsample.predict import LearnedPredictor, TokenWindow
from infsample_lab.bench.predictor import kendall_tau, replay_with_predictions
from verl_infsample.integration.settings import InfiniteRolloutSettings, SettingsError


def _token_trace(n_prompts: int, group: int, seed: int, scale: float = 1.0, max_len: int = 200,
                 prompt_tells: bool = True) -> list[TracePrompt]:
    """A synthetic token trace where the first tokens tell the length: a sample that will be long starts with
    high token ids, and (if ``prompt_tells``) its prompt's tokens tell the prompt's typical length."""
    rng = np.random.default_rng(seed)
    out = []
    for p in range(n_prompts):
        kind = int(rng.integers(0, 4))
        median = 12 * 2 ** kind * scale
        lengths = np.clip(np.round(median * np.exp(0.6 * rng.standard_normal(group))), 1, max_len).astype(int)
        noise = list(rng.integers(200, 300, 5 if prompt_tells else 10))
        prompt = [100 + kind] * 5 + noise if prompt_tells else noise
        tokens = []
        for n in lengths:
            mark = 10 + min(9, int(math.log2(n)))  # tells the length, to within a factor of 2
            tokens.append(tuple(int(t) for t in [mark] * min(n, 8) + list(rng.integers(400, 500, max(0, n - 8)))))
        out.append(TracePrompt(f"s{seed}p{p}", len(prompt), tuple(int(n) for n in lengths), tuple(map(int, prompt)),
                               tuple(tokens)))
    return out


# --- protocol, spec, settings -----------------------------------------------------------------------------------
def test_spec_settings_and_bad_options():
    p = make_predictor("learned:k=8", max_len=128)
    assert isinstance(p, LearnedPredictor) and p.name == "learned:k=8"
    assert p.checkpoints == (0, 1, 4, 8) and p.token_checkpoints == {1, 4, 8} and p.slot_checkpoints == {1, 8}
    assert make_predictor("learned:k=64", max_len=128).checkpoints == (0, 1, 4, 16, 64)
    spec = "learned:k=16,forget=0.99"
    assert InfiniteRolloutSettings.from_custom({"predictor": spec}).predictor == spec
    with pytest.raises(ValueError, match="KEY one of k, forget, min, q, state"):
        make_predictor("learned:quantile=0.8", max_len=10)
    with pytest.raises(ValueError, match="k needs a int"):
        make_predictor("learned:k=x", max_len=10)
    with pytest.raises(SettingsError, match=r"custom\.predictor='learned:forget=2'.*0 < F <= 1"):
        InfiniteRolloutSettings.from_custom({"predictor": "learned:forget=2"})
    with pytest.raises(ValueError, match="takes no argument"):
        make_predictor("history:3", max_len=10)


def test_falls_back_to_history_until_trained():
    learned, history = LearnedPredictor(100, k=8, min_samples=20), HistoryPredictor(100)
    g = Group("a", 10, 4)
    lengths = [5, 50, 20, 30, 7] * 3  # 15 samples: fewer than min_samples
    for i, n in enumerate(lengths):
        s = Sample(uid=i, group=0, index=i % 4, prompt_len=10)
        for p in (learned, history):
            p.observe(g, s, n)
    assert learned.trained_checkpoints() == []
    assert learned.predict(g, Sample(uid=99, group=0, index=0, prompt_len=10)) == history.predict(g, None)


def test_learns_from_tokens_and_ranks_samples():
    """On a trace where the first tokens tell the length, predictions at k=8 rank samples well after a warm-up,
    far better than history (which knows only prompts) does."""
    train = [_token_trace(12, 16, seed) for seed in range(6)]
    test = _token_trace(8, 16, 100)
    learned, history = make_predictor("learned:k=8", max_len=200), make_predictor("history", max_len=200)
    for rollout in train:
        for p in (learned, history):
            simulate(rollout, "infinite", SlotPool(8), p, max_len=200)
    assert learned.trained_checkpoints() == [0, 1, 8]
    _, at_k = replay_with_predictions(test, learned, 8, 8, 200)
    _, at_k_history = replay_with_predictions(test, history, 8, 8, 200)
    keys = sorted(at_k)
    true = [test[g].lengths[i] - 8 for g, i in keys]
    assert len(keys) == sum(n > 8 for p in test for n in p.lengths)  # every sample past k was predicted at k
    tau = kendall_tau([at_k[key] for key in keys], true)
    assert tau > 0.6
    assert tau > kendall_tau([at_k_history[key] for key in keys], true) + 0.2


def test_first_token_lookahead_orders_samples_within_groups():
    """With the first-token lookahead (every sample's first token drawn before the plan, from its group's prompt
    logits) the plan tells the samples of a group apart: under M slots the long ones start first and the decode
    steps come near the oracle's; without it, samples of a group share one prediction until they start."""
    train = [_token_trace(12, 16, seed, prompt_tells=False) for seed in range(4)]
    test = _token_trace(8, 16, 100, prompt_tells=False)
    steps = {}
    for lookahead in (True, False):
        p = make_predictor("learned:k=8", max_len=200)
        p.plans_on_first_token = lookahead
        for rollout in train:
            simulate(rollout, "infinite", SlotPool(8), p, max_len=200)
        res, sched = simulate(test, "infinite", SlotPool(8), p, max_len=200, return_scheduler=True)
        assert res.predict_ms > 0 and sched.stats.lookahead_prefills == (len(test) if lookahead else 0)
        steps[lookahead] = res.decode_steps
    oracle = simulate(test, "oracle", SlotPool(8), max_len=200).decode_steps
    print(steps, oracle)
    assert steps[True] < steps[False] and steps[True] <= 1.03 * oracle


def test_sibling_lengths_move_waiting_predictions():
    """A group's waiting samples share one prediction; when its siblings finish, it follows their lengths. (The
    path of engines without the first-token lookahead, e.g. vLLM: with it, samples are told apart before they start,
    the plan starts long ones first, and a sample's finished siblings say less about it.)"""
    p = make_predictor("learned:k=8,min=8", max_len=200)
    p.plans_on_first_token = False
    for rollout in [_token_trace(12, 16, seed, prompt_tells=False) for seed in range(4)]:
        simulate(rollout, "infinite", SlotPool(4), p, max_len=200)
    g_long, g_short = Group("new-long", 10, 8), Group("new-short", 10, 8)
    p.observe_prompt("new-long", list(range(200, 210)))
    p.observe_prompt("new-short", list(range(200, 210)))
    p.start_batch([g_long, g_short])
    waiting = [Sample(uid=i, group=0, index=i, prompt_len=10) for i in range(8)]
    before = p.predict(g_long, waiting[7]), p.predict(g_short, waiting[7])
    assert before[0] == before[1]  # nothing tells the two unseen prompts apart yet
    for s in waiting[:4]:
        p.observe(g_long, s, 150)
        p.observe(g_short, s, 4)
    after_long, after_short = p.predict(g_long, waiting[7]), p.predict(g_short, waiting[7])
    # siblings that finish early are the short ones (a censored view), so short ones move it less: the regressor
    # learned that from the rollouts; long finished siblings are strong evidence
    assert after_long > before[0] * 1.5 and after_short < after_long / 1.5



def test_waiting_predictions_follow_siblings_as_a_fresh_predictor_computes_them(tmp_path):
    """A waiting sample's prediction, refreshed as its siblings finish, is what a predictor that never predicted it
    before (the same state, loaded) says once it hears of the same siblings; another group's siblings do not move
    it, and a sample that started keeps the prediction of its start."""
    trace = _token_trace(8, 16, 0)
    p = make_predictor("learned:k=8,min=8", max_len=200)
    for seed in range(3):  # (under a KV budget, where waiting samples' predictions follow their siblings)
        simulate(_token_trace(8, 16, seed + 1), "infinite", KVBudget(1200), p, max_len=200)
    p.refit()
    p.save(tmp_path / "state.npz")
    fresh = make_predictor(f"learned:k=8,min=8,state={tmp_path / 'state.npz'}", max_len=200)
    groups = [Group(t.prompt_id, t.prompt_len, 16) for t in trace[:2]]
    samples = {pred: [Sample(uid=g * 16 + i, group=g, index=i, prompt_len=10) for g in range(2) for i in range(16)]
               for pred in (p, fresh)}
    for pred in (p, fresh):
        for t in trace[:2]:
            pred.observe_prompt(t.prompt_id, t.prompt_tokens)
        pred.start_batch(groups)
        for s in samples[pred]:  # the first-token lookahead
            assert pred.observe_tokens(groups[s.group], s, TokenWindow(trace[s.group].tokens[s.index][:1]))
    first = [p.predict(groups[s.group], s) for s in samples[p]]
    assert len(set(np.round(first, 6))) > 2  # the first tokens tell the samples apart
    started = samples[p][7]
    started.generated = 4
    p.observe_tokens(groups[0], started, TokenWindow(trace[0].tokens[7][:4]))
    at_start = p.predict(groups[0], started)

    for pred in (p, fresh):  # three samples of group 0 finish long
        for s in samples[pred][:3]:
            pred.observe(groups[0], s, 150 + s.index)
    for s, f in zip(samples[p][3:16], samples[fresh][3:16]):
        if s is not started:
            assert p.predict(groups[0], s) == pytest.approx(fresh.predict(groups[0], f), rel=1e-9)
    moved = [p.predict(groups[0], s) / first[s.uid] for s in samples[p][3:16] if s is not started]
    assert min(moved) > 1.05  # long siblings raised every waiting sample's prediction
    assert [p.predict(groups[1], s) for s in samples[p][16:]] == first[16:]  # another group's siblings did not
    assert p.predict(groups[0], started) == at_start  # it keeps the siblings of its start


def test_save_load_warm_start_and_mismatch(tmp_path):
    trace = _token_trace(10, 16, 3)
    state = tmp_path / "len.npz"
    p = make_predictor(f"learned:k=8,state={state}", max_len=200)
    simulate(trace, "infinite", SlotPool(8), p, max_len=200)
    assert not state.exists()  # saved when the next batch starts, with what the last one taught
    simulate(trace, "infinite", SlotPool(8), p, max_len=200)
    assert state.exists()
    warm = make_predictor(f"learned:k=8,state={state}", max_len=200)  # a restart
    assert warm.observed == 160 and warm.trained_checkpoints() == p.trained_checkpoints()
    p.save(state)
    warm = make_predictor(f"learned:k=8,state={state}", max_len=200)
    g = Group(trace[0].prompt_id, trace[0].prompt_len, 16)
    p.refit()  # its regressors may wait for more samples before re-solving; the loaded one solves on first use
    for pred in (p, warm):
        pred.observe_prompt(g.prompt_id, trace[0].prompt_tokens)
        pred.start_batch([g])
    s = Sample(uid=0, group=0, index=0, prompt_len=trace[0].prompt_len)
    assert warm.predict(g, s) == pytest.approx(p.predict(g, s), rel=1e-4)
    s.generated = 30  # the earlier lengths kept for a sample past its prediction come back too
    assert warm.predict_outgrown(g, s) == p.predict_outgrown(g, s) < 200
    s.generated = 0
    window = TokenWindow(trace[0].tokens[0][:8])
    assert warm.observe_tokens(g, s, window) and p.observe_tokens(g, s, window)
    assert warm.predict(g, s) == pytest.approx(p.predict(g, s), rel=1e-4)
    with pytest.raises(ValueError, match=r"learned at checkpoints \[0, 1, 4, 8\].*k=16"):
        make_predictor(f"learned:k=16,state={state}", max_len=200)
    (tmp_path / "bad.npz").write_text("not a state")
    with pytest.raises(ValueError, match="bad.npz: cannot read it"):
        make_predictor(f"learned:state={tmp_path / 'bad.npz'}", max_len=200)


def test_refined_predictions_reach_the_kv_projection():
    """Under a KV budget the scheduler admits against predicted remaining lengths: refined predictions reach it
    (running samples' predictions change as their tokens arrive) and the budget is never exceeded."""
    train = [_token_trace(8, 16, seed, scale=2) for seed in range(5)]
    test = _token_trace(6, 16, 50, scale=2)
    learned, history = make_predictor("learned:k=8", max_len=200), make_predictor("history", max_len=200)
    for rollout in train:
        for p in (learned, history):
            simulate(rollout, "infinite", KVBudget(1200), p, max_len=200)
    plan: dict = {}
    seen_running: dict = {}

    def watch(sched):
        for s in sched.samples:
            plan.setdefault(s.key, s.predicted_len)
        for s in sched.running:
            seen_running[s.key] = s.predicted_len

    res_l, sched = simulate(test, "infinite", KVBudget(1200), learned, max_len=200, return_scheduler=True,
                            on_step=watch)
    assert sched.stats.refine_ms > 0
    changed = sum(seen_running[key] != plan[key] for key in seen_running)
    assert changed > len(seen_running) / 2
    # a projection that missed the refinements would reserve far more and take far longer; one trace's steps move by
    # several percent with any change to the run-time policy, so three traces count together
    steps = {"learned": res_l.decode_steps, "history": 0}
    assert res_l.peak_kv_tokens <= 1200
    for seed in (50, 51, 52):
        test = _token_trace(6, 16, seed, scale=2)
        if seed != 50:
            steps["learned"] += simulate(test, "infinite", KVBudget(1200), learned, max_len=200).decode_steps
        steps["history"] += simulate(test, "infinite", KVBudget(1200), history, max_len=200).decode_steps
    assert steps["learned"] <= steps["history"] * 1.10, steps


def test_trace_tokens_round_trip(tmp_path):
    trace = _token_trace(2, 3, 7)
    trace[0] = TracePrompt(trace[0].prompt_id, trace[0].prompt_len, trace[0].lengths, trace[0].prompt_tokens,
                           trace[0].tokens, logprobs=tuple(tuple(-1.0 for _ in t) for t in trace[0].tokens),
                           entropies=tuple(tuple(0.5 for _ in t) for t in trace[0].tokens),
                           stop_logprobs=tuple(tuple(-math.inf for _ in t) for t in trace[0].tokens))
    write_trace(trace, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == trace
    bad = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    bad["tokens"][1] = bad["tokens"][1][:-1]
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    from verl_infsample.core.trace import TraceError

    with pytest.raises(TraceError, match=r"bad.jsonl:1: 'tokens'\[1\] must be a list of lengths\[1\]"):
        read_trace(tmp_path / "bad.jsonl")
    plain = synth_trace(1, 4, 100)  # traces without tokens still replay with learned (no token reports)
    res = simulate(plain, "infinite", SlotPool(2), "learned", max_len=100)
    assert res.total_tokens == sum(plain[0].lengths) and res.decode_steps >= res.lower_bound_steps


# --- the real tiny model -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_rollouts(tiny_model_dir, tiny_engine):
    """Token traces of the tiny model: 3 epochs at eos bias 0, then 4 at +2 (shorter answers), same prompts."""
    from transformers import AutoTokenizer

    from verl_infsample.engines.sampling import SamplingParams
    from infsample_lab.models.tiny import default_prompts
    from infsample_lab.bench.predictor import record_rollout

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = default_prompts(6, seed=777)
    ids = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for t in texts]
    out = []
    for epoch, bias in enumerate([0.0] * 3 + [2.0] * 4):
        params = SamplingParams(max_new_tokens=64, stop_token_ids=(tok.eos_token_id,), seed=epoch,
                                logit_bias=((tok.eos_token_id, bias),))
        out.append(record_rollout(tiny_engine, ids, texts, 16, params))
    return ids, out, tok.eos_token_id


def _plan_log_ratios(predictor, rollout: list[TracePrompt]) -> np.ndarray:
    """log(predicted / true length) of every sample, as the plan predicts it: before any token is decoded, from
    the first token where the predictor plans on it (the engines' first-token lookahead)."""
    groups = [Group(p.prompt_id, p.prompt_len, p.group_size) for p in rollout]
    for p in rollout:
        if hasattr(predictor, "observe_prompt"):
            predictor.observe_prompt(p.prompt_id, p.prompt_tokens)
    if hasattr(predictor, "start_batch"):
        predictor.start_batch(groups)
    ratios = []
    for g, p in zip(groups, rollout):
        for i, n in enumerate(p.lengths):
            s = Sample(uid=0, group=0, index=i, prompt_len=g.prompt_len)
            if getattr(predictor, "plans_on_first_token", False):
                predictor.observe_tokens(g, s, TokenWindow(p.tokens[i][:1], p.logprobs[i][:1], p.entropies[i][0],
                                                           p.stop_logprobs[i][0]))
            ratios.append(math.log(predictor.predict(g, s) / n))
    return np.array(ratios)


def test_adapts_when_the_length_distribution_shifts(tiny_rollouts):
    """eos bias 0 -> +2 mid-run (answers get shorter): the plan's systematic error |mean log(predicted / true)|
    jumps, then returns to its former level from the next rollout of 96 samples on, while history (a mean over all
    it has seen) stays off."""
    _, rollouts, _ = tiny_rollouts
    learned = make_predictor("learned:k=8,min=16", max_len=64)
    history = make_predictor("history", max_len=64)
    errors, history_errors, noise = [], [], []
    for rollout in rollouts:
        ratios = _plan_log_ratios(learned, rollout)
        errors.append(abs(ratios.mean()))
        noise.append(ratios.std() / math.sqrt(len(ratios)))  # the standard error of that mean
        history_errors.append(abs(_plan_log_ratios(history, rollout).mean()))
        simulate(rollout, "infinite", SlotPool(8), learned, max_len=64)
        simulate(rollout, "infinite", SlotPool(8), history, max_len=64)
    print("mean lengths", [round(float(np.mean([n for p in r for n in p.lengths])), 1) for r in rollouts])
    print("learned |mean log ratio| per rollout", np.round(errors, 3), "history", np.round(history_errors, 3))
    print("standard error of each mean", np.round(noise, 3))
    before, jump = float(np.mean(errors[1:3])), errors[3]  # after one warm-up rollout; measured: 0.03
    assert jump > 1.5 * before + 0.1  # the shift is visible (measured 0.86)
    # and learned away: back from the first rollout after it, within the noise of a mean of 96 samples (measured
    # 0.03, 0.13, 0.03, standard errors 0.06-0.08): the last batch's mean residual shifts the next batch's
    # predictions while the regressors catch up (without it: 0.54, 0.28, 0.18)
    assert all(e <= before + 2 * se for e, se in zip(errors[4:], noise[4:]))
    assert errors[-1] < history_errors[-1] - 0.3  # history: 0.94


def test_engine_reports_tokens_at_checkpoints(tiny_engine, tiny_rollouts):
    """The real engine feeds the predictor at its checkpoints without changing a token (schedule invariance), and
    the predictor's time per decode step is reported (the figure the README quotes comes from eval-predictor)."""
    from verl_infsample.engines.sampling import SamplingParams

    ids, rollouts, eos = tiny_rollouts
    learned = make_predictor("learned:k=8,min=16", max_len=64)
    for rollout in rollouts[:3]:
        simulate(rollout, "infinite", SlotPool(8), learned, max_len=64)
    seen = []
    original = learned.observe_tokens
    learned.observe_tokens = lambda g, s, w: seen.append(len(w.token_ids)) or original(g, s, w)
    texts = [p.prompt_id for p in rollouts[0]]
    params = SamplingParams(max_new_tokens=64, stop_token_ids=(eos,), seed=0, logit_bias=((eos, 0.0),))
    res = tiny_engine.rollout(ids, 16, params, policy="infinite", capacity=SlotPool(8), predictor=learned,
                              prompt_ids=texts)
    assert [[tuple(o.token_ids) for o in g] for g in res.outputs] == [list(t.tokens) for t in rollouts[0]]
    # every sample's first token comes from the lookahead before the plan (one prompt pass per group), once
    assert set(seen) == {1, 8} and seen[:len(ids) * 16] == [1] * (len(ids) * 16) and seen.count(1) == len(ids) * 16
    assert res.stats.lookahead_prefills == len(ids)
    assert seen.count(8) == sum(len(t) >= 8 for p in rollouts[0] for t in p.tokens)
    assert 0 < res.stats.refine_ms / 1e3 < 0.1 * res.timing.engine_s


def test_eval_predictor_cli_on_traces(tmp_path):
    train = []
    for seed in range(4):
        write_trace(_token_trace(8, 16, seed), tmp_path / f"train{seed}.jsonl")
        train += ["--trace-train", str(tmp_path / f"train{seed}.jsonl")]
    write_trace(_token_trace(6, 16, 99), tmp_path / "test.jsonl")
    exe = Path(sys.executable).parent / "infsample"
    proc = subprocess.run([str(exe), "eval-predictor", "--trace", str(tmp_path / "test.jsonl"), *train, "--k", "8",
                           "--max-len", "200", "--json", "--plot", str(tmp_path / "eval.png")],
                          capture_output=True, text=True, check=True)
    d = json.loads(proc.stdout)
    assert {"kendall_tau", "mae", "steps_vs_oracle", "decode_steps"} <= set(d)
    assert "scored" not in d  # the per-sample predictions are drawn, not printed
    assert (tmp_path / "eval.png").read_bytes().startswith(b"\x89PNG")
    assert d["kendall_tau"] > 0.5 and d["steps_vs_oracle"] >= 1.0
    assert set(d["decode_steps"]) == {"learned", "history", "none", "oracle"}
    assert d["capacity"] == "slots=8" and set(d["preemptions"].values()) == {0}
    # the same under a KV budget: the warm-up, the test and the comparison; oracle plans what provably fits
    kv = json.loads(subprocess.run([str(exe), "eval-predictor", "--trace", str(tmp_path / "test.jsonl"), *train,
                                    "--k", "8", "--max-len", "200", "--kv-budget", "1200", "--json"],
                                   capture_output=True, text=True, check=True).stdout)
    assert kv["capacity"] == "kv_budget=1200 tokens" and kv["preemptions"]["oracle"] == 0
    assert kv["kendall_tau"] > 0.5 and kv["decode_steps"] != d["decode_steps"]
    bad = subprocess.run([str(exe), "eval-predictor", "--trace", str(tmp_path / "test.jsonl")], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--trace needs at least one --trace-train" in bad.stderr
    small = subprocess.run([str(exe), "eval-predictor", "--trace", str(tmp_path / "test.jsonl"), *train, "--max-len",
                            "200", "--kv-budget", "150"], capture_output=True, text=True)
    assert small.returncode == 2 and "--kv-budget 150 fits no sample" in small.stderr


def test_the_evaluation_plot_draws_every_scored_sample(tmp_path, monkeypatch):
    """``--plot``: one point per scored test sample and predictor (at its true and predicted remaining length), and
    one bar per predictor at its decode steps relative to oracle's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from infsample_lab.bench.plots import plot_predictor_evaluation
    from infsample_lab.bench.predictor import evaluate_predictor

    train = [_token_trace(8, 16, seed) for seed in range(3)]
    result, _ = evaluate_predictor(train, _token_trace(4, 16, 98), k=8, max_len=200)
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    plot_predictor_evaluation(result, str(tmp_path / "eval.png"))
    left, right = drawn[0].axes
    points = [c.get_offsets() for c in left.collections]
    true = result.scored.true
    assert len(points) == 2 and len(true) == result.test_samples - sum(n <= 8 for p in _token_trace(4, 16, 98)
                                                                         for n in p.lengths)
    for xy, predicted in zip(points, (result.scored.history, result.scored.learned)):
        assert np.allclose(xy[:, 0], true) and np.allclose(xy[:, 1], predicted)
    heights = [bar.get_height() for bar in right.patches]
    oracle = result.decode_steps["oracle"]
    assert np.allclose(heights, [result.decode_steps[n] / oracle for n in ("learned", "history", "none", "oracle")])


# --- the tiny model whose first tokens tell the length (variant "modes-quick") ----------------------------------
@pytest.fixture(scope="session")
def tiny_modes_model_dir():
    """The "modes" tiny model (answers: direct / count / step, drawn per sample) in its tests' build, 3000 steps
    ("modes-quick", ~40 s of one core), into ``.cache/tiny-model-modes-quick/`` and reused."""
    from infsample_lab.models.tiny import tiny_model_path

    return str(tiny_model_path(variant="modes-quick"))


def test_modes_variant_first_tokens_tell_the_length(tiny_modes_model_dir):
    """Where a sample's first tokens announce its length (as a real LLM's "Let me think step by step" does), the
    learned predictor ranks held-out samples at k=8 far better than history (which, on unseen prompts, knows only
    the global mean: tau 0). The default tiny model, whose answers end almost at random, reaches ~0.1 here."""
    from infsample_lab.bench.predictor import evaluate_predictor, model_rollouts

    rollouts = model_rollouts(tiny_modes_model_dir, train_rollouts=3, train_prompts=8, train_group=16,
                              test_prompts=8, test_group=16, max_new_tokens=64, seed=0)
    ev, _ = evaluate_predictor(rollouts.train, rollouts.test, k=8, slots=8, max_len=64, seed=0)
    print(ev.as_dict())
    assert ev.trained_checkpoints == [0, 1, 8]
    # this setting, seeds 0-2: tau 0.63-0.75 (the 8000-step "modes" build over seeds 0-11: 0.50-0.78), history 0.0;
    # the default tiny model: 0.05-0.23
    assert ev.kendall_tau > ev.history_kendall_tau + 0.3
    assert ev.mae < ev.history_mae


def test_a_higher_quantile_reserves_more_and_preempts_less_under_a_kv_budget():
    """``learned:q=Q`` predicts the Q quantile of the remaining length (log-normal around the regression, spread
    from its residuals): under a KV budget it reserves more per sample and fewer samples outgrow their reservation."""
    train = [_token_trace(8, 16, seed, scale=2) for seed in range(5)]
    test = _token_trace(6, 16, 50, scale=2)
    runs = {}
    for q in (0.5, 0.9):
        p = make_predictor(f"learned:k=8,q={q}", max_len=200)
        assert p.quantile == q
        for rollout in train:
            simulate(rollout, "infinite", KVBudget(1200), p, max_len=200)
        runs[q] = simulate(test, "infinite", KVBudget(1200), p, max_len=200)
        assert 0.2 < p._sigma[p.checkpoints.index(8)] < 2.0  # the residuals' spread, in log tokens, was estimated
    print({q: (r.decode_steps, r.preemptions) for q, r in runs.items()})
    assert runs[0.9].preemptions < runs[0.5].preemptions / 2
    assert runs[0.9].peak_kv_tokens <= 1200
    with pytest.raises(ValueError, match="0 < Q < 1"):
        make_predictor("learned:q=1", max_len=200)


def test_the_monte_carlo_ceiling_is_exact_for_a_greedy_model(tiny_modes_model_dir):
    """``ceiling_predictions`` continues each sample from its own first k tokens. Greedy decoding has no randomness
    left after k tokens, so its estimate is every sample's true remaining length (an off-by-one in the prefix, or
    a continuation that ignored it, would not be)."""
    from transformers import AutoTokenizer

    from verl_infsample.engines.sampling import SamplingParams
    from verl_infsample.engines.transformers_engine import TransformersEngine
    from infsample_lab.models.tiny import model_prompts
    from infsample_lab.bench.predictor import ceiling_predictions, record_rollout

    tok = AutoTokenizer.from_pretrained(tiny_modes_model_dir)
    engine = TransformersEngine.from_pretrained(tiny_modes_model_dir)
    texts = list(dict.fromkeys(model_prompts(tiny_modes_model_dir, 6, seed=4242)))
    ids = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) for t in texts]
    params = SamplingParams(temperature=0.0, max_new_tokens=48, stop_token_ids=(tok.eos_token_id,))
    trace = record_rollout(engine, ids, texts, 2, params)
    k = 4
    best = ceiling_predictions(engine, trace, k, params, continuations=2)
    expected = {(g, i): float(n - k) for g, p in enumerate(trace) for i, n in enumerate(p.lengths) if n > k}
    assert len(expected) >= 4 and best.keys() == expected.keys()
    assert best == pytest.approx(expected)
    with pytest.raises(ValueError, match="--ceiling"):
        ceiling_predictions(engine, trace, k, params, continuations=0)

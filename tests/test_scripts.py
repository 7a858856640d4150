"""The measurement scripts in scripts/: the figures the README quotes from them, and their plots."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_simulated_gpu_check_at_rollout_n_1024():
    """scripts/sim_gpu_check.py's row the README quotes: under memoryless lengths, knowing them (oracle) beats verl's
    plain submission without a preemption, and history-based infinite preempts far less than plain."""
    rows = {r["policy"]: r for r in _script("sim_gpu_check").compare(1024)}
    plain, oracle, infinite = rows["plain"], rows["oracle"], rows["infinite"]
    assert plain["preemptions"] > 1000 and oracle["preemptions"] == 0
    assert oracle["decode_steps"] < plain["decode_steps"]
    assert infinite["preemptions"] < plain["preemptions"] / 3
    assert infinite["recompute_tokens"] < plain["recompute_tokens"] / 3


def test_the_replay_table_runs_each_predictor_and_reports_the_gap_closed(capsys):
    """scripts/replay_table.py (the README's replay table) at toy sizes: one row per backend, predictor and visit,
    infinite once per predictor, the oracle's gap share 1 and verl's 0, and the markdown table."""
    module = _script("replay_table")
    args = ["--replicas", "1", "--n", "4", "--caps", "256", "--pools", "tight", "--samples-per-replica", "32",
            "--max-num-seqs", "8", "--predictors", "noisy:0.3,none", "--backends", "vllm,infinite,oracle",
            "--seed", "5"]
    assert module.main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted({(r["backend"], r["visit"]) for r in rows}) == sorted(
        (b, v) for b in ("vllm", "oracle", "infinite (noisy:0.3)", "infinite (none)") for v in ("first", "revisit"))
    for r in rows:
        assert r["engine_steps"] >= r["lower_bound_steps"] > 0
        if r["backend"] == "vllm":
            assert r["steps_vs_vllm"] == 1 and r["gap_closed"] in (0, None)
        if r["backend"] == "oracle" and r["gap_closed"] is not None:
            assert r["gap_closed"] == 1
        assert (r["probes"] > 0) == (r["backend"] == "infinite (noisy:0.3)")
    table = module.markdown(rows)
    assert "infinite (noisy:0.3) steps / s vs vllm" in table and table.count("\n| 1 | 4 |") == 2


def test_the_drafts_table_runs_every_lane_on_text_and_synthetic_acceptance(tmp_path, capsys):
    """scripts/drafts_table.py (the README's drafts table) at toy sizes: a row per trace, each lane's time against
    drafts off; on text whose siblings agree the drafts are accepted, and group's budget is set against a fixed K."""
    groups = tmp_path / "g.jsonl"
    answer = " ".join(f"w{i}" for i in range(40))
    groups.write_text("\n".join(json.dumps({"prompt_id": f"q{i}", "prompt": f"say {i}",
                                            "responses": [f"{answer} end {j}" for j in range(6)]}) for i in range(4)))
    module = _script("drafts_table")
    args = ["--text", f"echo={groups}", "--accept", "0.5", "--replicas", "1", "--caps", "256",
            "--samples-per-replica", "32", "--spec-tokens", "4", "--history", "1", "--workers", "1",
            "--gpu-memory-utilization", "0.9"]
    assert module.main([*args, "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["trace"], r["cap"]) for r in rows] == [("echo", "-"), ("synthetic 0.5", "256")]
    echo, synthetic = rows
    assert echo["vllm_suffix_tokens_per_step"] > 1.5 and echo["infinite_group_tokens_per_step"] > 1.5
    assert echo["vllm_off_vs_vllm"] == 1.0 and "group_vs_fixed_k" not in echo
    assert echo["synchronous_floor_vs_vllm"] > 1.0  # the host's time, no longer overlapped, with nothing drafted
    # the device lane keeps the overlap: where its drafts are accepted it beats the host drafter's floor
    assert echo["infinite_group_gpu_tokens_per_step"] > 1.5
    assert echo["infinite_group_gpu_vs_vllm"] < echo["synchronous_floor_vs_vllm"]
    assert 0 < synthetic["group_vs_fixed_k"] and synthetic["infinite_suffix_tokens_per_step"] > 1.5
    table = module.markdown(rows)
    assert table.count("\n| ") == 2 and "| synthetic 0.5 | 256 | 1 |" in table


def test_the_simulator_seed_sweep_counts_single_traces(monkeypatch, capsys):
    """scripts/sim_seed_sweep.py: next to the mean ratios, how many single traces meet the simulator's goals (with
    exact lengths every trace's ``infinite`` is within 8% of the bound; naive is never better than ``infinite``)."""
    import sys

    monkeypatch.setattr(sys, "argv", ["sim_seed_sweep.py", "--seeds", "6", "--json"])
    _script("sim_seed_sweep").main()
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 6
    for r in rows:
        assert r["naive"] > r["infinite"] >= 1.0
    assert all(r["seeds_infinite_within_8pct"] == 6 for r in rows if r["predictor"] == "oracle")


@pytest.mark.integration
def test_the_gpu_check_dry_run_passes_and_the_replay_steps_as_the_real_engine_does(tmp_path):
    """scripts/gpu_check.sh --dry-run, as a user runs it (its default parts on the CPU): the doctor finds nothing
    wrong; drafts keep the sampled law and greedy tokens; the rollout part's requests, run on a real vLLM engine,
    take exactly the engine steps, preemptions and computed tokens the replay of the same requests gives (the
    replay is exact in steps), and every real step is in one band of the real-against-modeled table."""
    out = tmp_path / "report.json"
    proc = subprocess.run([str(SCRIPTS / "gpu_check.sh"), "--dry-run", "--out", str(out)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().split("\n")[-1])
    assert json.loads(out.read_text()) == report and report["ok"] and report["dry_run"]
    parts = report["parts"]
    assert list(parts) == ["doctor", "law", "rollout"] and parts["doctor"]["faults"] == []
    law = parts["law"]
    assert law["greedy_equal"] and law["max_abs_z"] < law["z_limit"] and 0 < law["accepted"] <= law["drafted"]
    rollout = parts["rollout"]
    for name in ("vllm", "infinite"):
        real, replayed = rollout["backends"][name]["real"], rollout["backends"][name]["replay"]
        for key in ("engine_steps", "preemptions", "computed_tokens"):
            assert real[key] == replayed[key], (name, key)
        assert sum(b["steps"] for b in rollout["backends"][name]["bands"]) == real["engine_steps"] > 0
    assert rollout["backends"]["vllm"]["real"]["preemptions"] > 0  # the trace outgrows the pool under verl's order
    assert "real_vs_modeled" in proc.stderr  # the table
    # its real decode steps load into the step model's points file: refused from a dry run (the CPU's seconds); a
    # GPU's report (this one, its dry-run mark taken off) adds a source and a point per backend and band
    from infsample_lab.replay import calibration

    points_file = tmp_path / "points.json"
    points_file.write_text(calibration.POINTS_FILE.read_text())
    with pytest.raises(SystemExit):
        calibration.main(["--add-gpu-check", str(out), "--points", str(points_file)])
    assert points_file.read_text() == calibration.POINTS_FILE.read_text()
    (tmp_path / "gpu.json").write_text(json.dumps({**report, "dry_run": False}))
    assert calibration.main(["--add-gpu-check", str(tmp_path / "gpu.json"), "--points", str(points_file)]) == 0
    sources, points = calibration.published_points(points_file)
    key = f"gpu-check-{report['date']}-h100"
    added = [p for p in points if p.source == key]
    decode = [b for backend in rollout["backends"].values() for b in backend["decode_points"]]
    assert key in sources and len(added) == len(decode) > 0 and len(points) == len(added) + len(
        calibration.published_points()[1])
    assert [p.seconds for p in added] == [b["seconds"] for b in decode] and all(p.kind == "step" for p in added)


def test_the_gpu_check_refuses_an_unknown_part_by_name(capsys):
    from infsample_lab.bench import gpu_check

    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--parts", "law,memory"])
    assert "--parts: unknown 'memory'" in capsys.readouterr().err


def test_the_transformers_gpu_check_dry_run(capsys, tmp_path):
    """The GPU check's ``transformers`` part, dry run (``scripts/gpu_check.sh --dry-run --parts transformers``):
    its comparison end to end on the CPU with the device sampler, one JSON report; infinite and plain keep the KV
    budget and draw exactly full's tokens."""
    from infsample_lab.bench import gpu_check_transformers

    assert gpu_check_transformers.main(["--dry-run", "--n", "16", "--no-hf", "--out", str(tmp_path / "r.json")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((tmp_path / "r.json").read_text()) == report
    (row,) = report["results"]
    assert row["n"] == 16 and set(row) == {"n", "prompts", "infinite", "plain", "full"}
    budget = report["kv_budget_tokens"]
    for name in ("infinite", "plain"):
        assert row[name]["identical_to_full"] is True
        assert row[name]["tokens"] == row["full"]["tokens"] > 16
    kv_budget_bytes = budget * report["kv_bytes_per_token"]
    assert row["infinite"]["peak_kv_bytes"] <= kv_budget_bytes < row["full"]["peak_kv_bytes"]


def test_a_gpu_check_report_is_drawn_per_path_against_rollout_n(tmp_path, monkeypatch):
    """--plot-from REPORT.json (a GPU machine's report, drawn here): per path, its peak KV and decode steps at each
    rollout.n it ran (a skipped row is left out), and a clear error for a file that is not a report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from infsample_lab.bench import gpu_check_transformers

    def path(kv, steps):
        return {"peak_gpu_memory_bytes": None, "peak_kv_bytes": kv, "decode_steps": steps}

    report = {"date": "2026-12-01", "device": "cpu", "model": {"shape": "tiny-qwen3"}, "prompt_len": 20,
              "max_new_tokens": 48, "kv_budget_tokens": 100, "kv_bytes_per_token": 1024, "results": [
                  {"n": 8, "prompts": 2, "full": path(2**20, 50), "infinite": path(2**19, 60)},
                  {"n": 32, "prompts": 2, "full": path(2**22, 70), "infinite": {"skipped": "past --budget-s 1"}}]}
    (tmp_path / "r.json").write_text(json.dumps(report) + "\n")
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    drawing = ["--plot-from", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]
    assert gpu_check_transformers.main(drawing) == 0
    mem, steps = drawn[0].axes
    lines = {line.get_label(): line.get_xydata().tolist() for line in mem.lines + steps.lines}
    assert lines["full: KV in use"] == [[8, 1.0], [32, 4.0]] and lines["infinite: KV in use"] == [[8, 0.5]]
    assert lines["full"] == [[8, 50], [32, 70]] and lines["infinite"] == [[8, 60]]
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")
    (tmp_path / "bad.json").write_text("not json\n")
    with pytest.raises(SystemExit, match="not a GPU check report"):
        gpu_check_transformers.main(["--plot-from", str(tmp_path / "bad.json"), "--plot", str(tmp_path / "b.png")])


def test_the_bench_seed_sweep_replays_the_engines_lengths():
    """scripts/bench_seed_sweep.py (the M=8 totals docs/engine.md quotes): the lengths are the tiny model's own at the
    bench's seed and at its warming seed; every replayed policy is at or above the slot lower bound, exact lengths
    reach it here, and the quantile variant predicts the quantile of the prompt's earlier lengths."""
    import math

    from infsample_lab.bench.engine import recorded_lengths
    from verl_infsample.core.sample import Group

    module = _script("bench_seed_sweep")
    rec = recorded_lengths(0, prompts=2, group_size=8, max_new_tokens=16)
    assert len(rec["prompt_lens"]) == 2 and all(len(g) == 8 for g in rec["this"] + rec["warm"])
    assert all(1 <= n <= 16 for g in rec["this"] + rec["warm"] for n in g) and rec["this"] != rec["warm"]
    steps = module.replay(rec, slots=2, max_new_tokens=16, quantiles=(0.9,))
    assert set(steps) == {"continuous", "infinite", "infinite-q0.9", "oracle"}
    lengths = [n for g in rec["this"] for n in g]
    bound = max(max(lengths), math.ceil(sum(lengths) / 2))
    assert min(steps.values()) >= bound and steps["oracle"] == bound
    predictor = module.QuantileHistory(16, 0.9)
    for n in (2, 4, 6, 8, 30):
        predictor.observe(Group("p", 5, 5), None, n)
    predictor.start_batch([])
    assert predictor.predict(Group("p", 5, 5), None) == pytest.approx(21.2)  # 8 + 0.6 x (30 - 8): linear


def test_the_bench_seed_sweep_budget_is_a_share_of_the_engines_full_peak():
    """``--kv-share``: ``full_peak_blocks`` is the peak the engine measures for ``full`` (so 0.2 of it is the goal's
    20%), and every budgeted replay (noisy lengths too) runs under it with at most M samples decoding: none takes fewer
    steps than the slot lower bound."""
    import math

    from infsample_lab.bench.engine import bench_workload, recorded_lengths
    from verl_infsample.core import SlotPool

    module = _script("bench_seed_sweep")
    rec = recorded_lengths(0, prompts=2, group_size=8, max_new_tokens=40)
    engine, prompt_ids, params, _ = bench_workload(prompts=2, seed=0, max_new_tokens=40)
    full = engine.rollout(prompt_ids, 8, params, policy="full", capacity=SlotPool(8))
    assert [[len(o.token_ids) for o in g] for g in full.outputs] == rec["this"]
    peak = module.full_peak_blocks(rec, engine.pool.block_size)
    assert peak * engine.pool.bytes_per_block == full.kv.peak_in_use_bytes
    steps = module.replay_under_budget(rec, 0.5, slots=2, max_new_tokens=40, noise=(0.1,))
    assert set(steps) == {"kv:infinite", "kv:plain", "kv:oracle", "kv:noisy:0.1"}
    lengths = [n for g in rec["this"] for n in g]
    assert min(steps.values()) >= max(max(lengths), math.ceil(sum(lengths) / 2))


def test_the_plan_benchmark_replays_kv_budget_workloads(monkeypatch, capsys):
    """scripts/bench_plan.py (docs/engine.md's plan-time figures): every workload is replayed under its budget; plans
    on exact lengths never preempt, none ends before its longest sample, and the total row adds the rows up."""
    import sys

    monkeypatch.setattr(sys, "argv", ["bench_plan.py", "--seeds", "1", "--synthetic", "1", "--json"])
    module = _script("bench_plan")
    longest = {name: max(max(p.lengths) for p in trace)
               for name, trace, *_ in module.workloads(1, 1)}
    module.main()
    rows = json.loads(capsys.readouterr().out)
    assert [r["workload"] for r in rows[:-1]] == list(longest) and rows[-1]["workload"] == "total"
    for r in rows[:-1]:
        assert r["decode_steps"] >= longest[r["workload"]] and r["plan_ms"] > 0
        if r["workload"].endswith("exact"):
            assert r["preemptions"] == 0
    assert rows[-1]["decode_steps"] == sum(r["decode_steps"] for r in rows[:-1])


def test_the_plan_size_benchmark_prints_a_row_per_m(capsys):
    """scripts/bench_plan_sizes.py (the README's planning-time row): one row per M, every plan within its reported
    guarantee of the lower bound and no schedule below it."""
    module = _script("bench_plan_sizes")
    assert module.main(["--prompts", "32", "--group-size", "16", "--slots", "4,64", "--replicas", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["slots"] for r in rows] == [4, 64, "2x1024"] and {r["samples"] for r in rows} == {512}
    assert rows[-1]["plan_ms"] > 0 and rows[-1]["eps_guaranteed"] <= 0.02
    for r in rows[:-1]:
        assert r["plan_ms"] > 0 and r["steps_vs_bound"] >= 1.0 and r["eps_guaranteed"] <= 0.02
        assert "fptas" in r["plan_method"] or "lpt" in r["plan_method"], r["plan_method"]  # the plan, no fallback


def test_the_simulator_figures_script_reproduces_the_results_table(tmp_path):
    """scripts/sim_figures.sh runs every command it lists, draws its plots (each PNG's metadata: its title, and per
    policy line the last decode step and the peak KV, which must be the figures its command printed), and its first
    comparison prints the table of decode steps in docs/results.md (the paper's setting) figure for figure."""
    import re
    import subprocess

    from PIL import Image

    run = subprocess.run(["bash", str(SCRIPTS / "sim_figures.sh"), str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("$ infsample ") == 11
    every_policy = {"full", "naive", "continuous", "lpt", "infinite", "oracle", "plain"}
    for png, trace, capacity, policies in (
            ("paper_slots.png", "paper.jsonl", "slots=8", every_policy),
            ("batch_kv.png", "batch.jsonl", "kv_budget=9792 tokens", {"continuous", "lpt", "infinite", "oracle"})):
        (command,) = [c for c in run.stdout.split("$ infsample")[1:] if f"--plot {tmp_path / png}" in c]
        cells = [line.split() for line in command.splitlines()[1:] if line.strip()]  # header, dashes, rows
        table = [dict(zip(cells[0], row)) for row in cells[2:]]
        assert {r["policy"] for r in table} == policies
        text = Image.open(tmp_path / png).text
        assert text["Title"] == f"{tmp_path / trace} under {capacity}"
        assert json.loads(text["Description"]) == {
            r["policy"]: {"last_step": int(r["decode_steps"]), "peak": float(r["peak_kv_tokens"])} for r in table}
    first = run.stdout.split("$ infsample")[2]  # the paper's setting under 8 slots
    printed = {line.split()[0]: line.split()[2:5] for line in first.splitlines()[3:] if line.strip()[:1].isalpha()}
    readme = (SCRIPTS.parent / "docs" / "results.md").read_text()
    table = readme[readme.index("**Decode steps against the lower bound**"):]
    for policy in ("naive", "continuous", "infinite", "oracle"):
        row = re.search(rf"^\| `{policy}`[^|]*\| (\d+) \| ([\d.]+) \| (\d+) \|$", table, re.M)
        assert row, policy
        steps, vs_bound, peak_kv = row.groups()
        assert printed[policy][0] == steps and printed[policy][2] == vs_bound, (policy, printed[policy])
    bound = re.search(r"\| policy \| decode steps \| / lower bound \((\d+)\)", table).group(1)
    assert printed["infinite"][1] == bound


@pytest.mark.integration  # it rolls out the tiny model
def test_the_predictor_figures_script_at_tiny_sizes(tmp_path):
    """scripts/predictor_figures.py (the README's learned-predictor table) end to end at tiny sizes: a row per
    figure, a column per seed, the JSON line of each seed under OUT (on the tests' modes model, built once)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(SCRIPTS / "predictor_figures.py"), "--variant", "modes-quick",
                          "--seeds", "0", "--ceiling", "2",
                          "--out", str(tmp_path), "--train-rollouts", "1", "--train-prompts", "2", "--train-group",
                          "4", "--test-prompts", "2", "--test-group", "8", "--max-len", "32"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| seed | 0 |" and len(rows) == 7 and all(r.count("|") == 3 for r in rows)
    (record,) = [json.loads(line) for line in (tmp_path / "modes-quick.jsonl").read_text().splitlines()]
    assert record["decode_steps"]["oracle"] <= record["decode_steps"]["learned"]
    assert -1 <= record["kendall_tau"] <= 1


def test_the_held_rests_benchmark_releases_every_held_rest_once(capsys):
    """scripts/bench_held_rests.py (the re-ranking cost docs/vllm.md quotes) at tiny sizes: every held rest is
    released exactly once, one a finished sample, and each release's time is reported."""
    _script("bench_held_rests").main(["--groups", "3", "--n", "5", "--probe-tokens", "4", "--max-len", "64"])
    out = json.loads(capsys.readouterr().out)
    assert out["held"] == out["released"] == 15 and out["releases"] == 15
    assert 0 <= out["release_ms_median"] <= out["release_ms_max"] <= out["release_ms_total"]


def test_a_tree_of_thought_log_becomes_groups_eval_drafter_reads(tmp_path):
    """``scripts/tot_groups.py``: a tree-of-thought-llm log (a list of {"idx", "ys", ...}) and the game's puzzles
    become one prompt a line, the skipped puzzles left out, read back as the drafters' groups; anything else is
    refused by name."""
    from verl_infsample.core.text_groups import load_groups

    log = tmp_path / "log.json"
    log.write_text(json.dumps([{"idx": 900 + i, "ys": [f"Steps:\n{i} + 1 = {i + 1}", f"answer {i}"], "infos": []}
                               for i in range(3)]))
    puzzles = tmp_path / "24.csv"
    puzzles.write_text("Rank,Puzzles\n" + "".join(f"{r},{r} {r} {r} {r}\n" for r in range(1, 1001)))
    out = tmp_path / "groups.jsonl"
    run = subprocess.run([sys.executable, str(SCRIPTS / "tot_groups.py"), str(log), "--puzzles", str(puzzles),
                          "--skip", "1", "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in out.read_text().split("\n") if line]
    assert [(r["prompt_id"], r["prompt"]) for r in rows] == [("tot-901", "902 902 902 902"),
                                                             ("tot-902", "903 903 903 903")]
    groups = load_groups(out, str.split)
    assert [len(g.responses) for g in groups] == [2, 2] and groups[0].responses[1] == ["answer", "1"]
    log.write_text(json.dumps({"not": "a log"}))
    bad = subprocess.run([sys.executable, str(SCRIPTS / "tot_groups.py"), str(log), "--out", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "not a tree-of-thought-llm log" in bad.stderr

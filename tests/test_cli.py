"""The ``infsample`` command: its JSON contract, and clear errors (exit 2, no traceback) on bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_infsample.cli import main

REQUIRED = {"policy", "decode_steps", "lower_bound_steps", "peak_active", "peak_kv_tokens", "preemptions",
            "plan_ms", "total_tokens"}


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "t.jsonl"
    assert main(["trace", "synth", "--prompts", "2", "--group-size", "16", "--max-len", "512", "--dist", "bimodal",
                 "--seed", "1", "--out", str(path)]) == 0
    return path


def test_simulate_json_contract(trace_file, capsys):
    capsys.readouterr()
    assert main(["simulate", "--trace", str(trace_file), "--slots", "4", "--json", "--policy", "naive,infinite",
                 "--policy", "oracle"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["naive", "infinite", "oracle"]
    for r in rows:
        assert REQUIRED <= set(r)
        assert r["total_tokens"] == rows[0]["total_tokens"]
        assert r["decode_steps"] >= r["lower_bound_steps"]


def read_table(text):
    """The rows of a ``format_table`` table (header, dashes, rows) as dicts of strings."""
    lines = [line.split() for line in text.strip().splitlines()]
    return [dict(zip(lines[0], row)) for row in lines[2:]]


def test_simulate_table_and_plot(trace_file, tmp_path, capsys, drawn_figures):
    """The plot draws, per policy of the table, KV tokens in use over decode steps: each line ends at the policy's
    decode steps and peaks at its peak KV, within the budget but for ``full``; the PNG's metadata says the same."""
    from PIL import Image

    plot = tmp_path / "kv.png"
    assert main(["simulate", "--trace", str(trace_file), "--kv-budget", "6000", "--max-len", "512",
                 "--plot", str(plot)]) == 0
    rows = read_table(capsys.readouterr().out)
    assert {"infinite", "naive"} <= {r["policy"] for r in rows}
    (fig,) = drawn_figures
    (ax,) = fig.axes
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == (f"{trace_file} under kv_budget=6000 tokens",
                                                                  "decode step", "KV tokens")
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == [r["policy"] for r in rows]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [r["policy"] for r in rows]
    for row, line in zip(rows, lines):
        steps, kv = line.get_xdata(), line.get_ydata()
        assert list(steps) == sorted(steps) and steps[-1] == int(row["decode_steps"]), row
        assert max(kv) == int(row["peak_kv_tokens"]) and min(kv) >= 0, row
        assert (max(kv) <= 6000) == (row["policy"] != "full"), row  # full: whole groups, whatever the budget
    png = Image.open(plot)
    assert png.format == "PNG" and png.text["Title"] == ax.get_title()
    assert json.loads(png.text["Description"]) == {
        r["policy"]: {"last_step": int(r["decode_steps"]), "peak": float(r["peak_kv_tokens"])} for r in rows}


@pytest.mark.parametrize("args, message", [
    (["--slots", "0"], "slots (M) must be >= 1"),
    (["--kv-budget", "100", "--max-len", "512"], "cannot hold one sample"),
    (["--slots", "4", "--policy", "magic"], "unknown --policy 'magic'"),
    (["--slots", "4", "--predictor", "crystal-ball"], "unknown predictor"),
    (["--slots", "4", "--max-len", "3"], "shorter than the longest sample"),
])
def test_bad_input_is_one_clear_error(trace_file, capsys, args, message):
    assert main(["simulate", "--trace", str(trace_file), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_console_script_reports_malformed_trace(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_id": "a", "prompt_len": 2, "lengths": [3, "x"]}\n')
    exe = Path(sys.executable).parent / "infsample"
    assert exe.exists(), "the console script is not installed in the environment"
    proc = subprocess.run([str(exe), "simulate", "--trace", str(bad), "--slots", "2"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 2
    assert f"{bad}:1: 'lengths'[1] must be an integer >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_core_imports_without_torch_ray_or_verl():
    code = ("import sys, verl_infsample.core, verl_infsample.engines, verl_infsample.cli; "
            "bad = [m for m in ('torch', 'ray', 'verl', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def drawn_bars(ax):
    """Per bar series of ``ax`` (by label): the bar heights, and the (low, high) of each error line (None without)."""
    from matplotlib.container import BarContainer

    out = {}
    for bars in ax.containers:
        if isinstance(bars, BarContainer):
            ranges = None
            if bars.errorbar is not None:
                (lines,) = bars.errorbar.lines[2]
                ranges = [(float(lo), float(hi)) for (_, lo), (_, hi) in lines.get_segments()]
            out[bars.get_label()] = ([float(p.get_height()) for p in bars.patches], ranges)
    return out


BENCH_LABELS = ["verl rollout.name=vllm", "rollout.name=infinite (vLLM)"]
BENCH_YLABELS = ["engine wall time of the rollout (s)", "engine steps"]


def test_bench_verl_ratios_are_against_verls_vllm_rollout_at_the_same_n(tmp_path, drawn_figures):
    from infsample_lab.bench.in_verl import VerlBenchRow, with_ratios
    from infsample_lab.bench.plots import plot_bench_verl

    def row(backend, n, gen_s, steps):
        return VerlBenchRow(backend=backend, n=n, prompts=128 // n, samples=128, gen_s=gen_s, engine_steps=steps,
                            preemptions=0, tokens_computed=1, generated_tokens=1, cached_prompt_tokens=0,
                            peak_kv_blocks=1, kv_blocks=24, kv_block_size=128, verl_gen_s=1.0)

    rows = with_ratios([row("vllm", 16, 4.0, 200), row("infinite", 16, 3.0, 150), row("infinite", 64, 1.0, 10)])
    assert (rows[0].gen_s_vs_vllm, rows[0].steps_vs_vllm) == (1.0, 1.0)
    assert (rows[1].gen_s_vs_vllm, rows[1].steps_vs_vllm) == (0.75, 0.75)
    assert rows[2].gen_s_vs_vllm is None  # no baseline at n=64 in this run: no ratio
    plot_bench_verl([vars(r) for r in rows], str(tmp_path / "b.png"))
    (fig,) = drawn_figures
    gen_s, steps = fig.axes
    assert [ax.get_ylabel() for ax in fig.axes] == BENCH_YLABELS
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["n=16\n8 prompt(s)", "n=64\n2 prompt(s)"]
    assert [t.get_text() for t in gen_s.get_legend().get_texts()] == BENCH_LABELS
    # one run each: the bar is the run, no range line; no vllm run at n=64: a zero bar
    assert drawn_bars(gen_s) == dict(zip(BENCH_LABELS, [([4.0, 0.0], None), ([3.0, 1.0], None)]))
    assert drawn_bars(steps) == dict(zip(BENCH_LABELS, [([200.0, 0.0], None), ([150.0, 10.0], None)]))
    assert "median" not in fig.get_suptitle()


def test_bench_verl_repeats_pair_each_run_with_verls_beside_it(tmp_path, drawn_figures):
    """Under --repeats, a run's ratios are against verl's run of the same repeat, and the summary gives per backend
    and n the median and the range one run shows."""
    from infsample_lab.bench.in_verl import VerlBenchRow, repeat_summary, with_ratios
    from infsample_lab.bench.plots import plot_bench_verl

    def row(backend, steps, repeat):
        return VerlBenchRow(backend=backend, n=16, prompts=8, samples=128, gen_s=steps / 100, engine_steps=steps,
                            preemptions=0, tokens_computed=1, generated_tokens=1, cached_prompt_tokens=0,
                            peak_kv_blocks=1, kv_blocks=24, kv_block_size=128, verl_gen_s=1.0,
                            lower_bound_steps=100, steps_vs_lower_bound=steps / 100, repeat=repeat)

    rows = with_ratios([row("vllm", 200, 0), row("infinite", 180, 0), row("vllm", 100, 1), row("infinite", 120, 1),
                        row("vllm", 150, 2), row("infinite", 150, 2)])
    assert [r.steps_vs_vllm for r in rows if r.backend == "infinite"] == [0.9, 1.2, 1.0]
    verl, ours = repeat_summary(rows)
    assert (verl.backend, verl.runs, verl.engine_steps, verl.steps_min, verl.steps_max) == ("vllm", 3, 150, 100, 200)
    assert (ours.steps_vs_vllm, ours.steps_vs_vllm_min, ours.steps_vs_vllm_max) == (1.0, 0.9, 1.2)
    assert ours.engine_steps == 150 and ours.steps_vs_lower_bound == 1.5
    plot_bench_verl([vars(r) for r in rows], str(tmp_path / "b.png"))
    (fig,) = drawn_figures
    gen_s, steps = fig.axes
    assert [ax.get_ylabel() for ax in fig.axes] == BENCH_YLABELS
    assert [t.get_text() for t in steps.get_xticklabels()] == ["n=16\n8 prompt(s)"]
    # the median of the three runs, a line over their range
    assert drawn_bars(steps) == dict(zip(BENCH_LABELS, [([150.0], [(100.0, 200.0)]), ([150.0], [(120.0, 180.0)])]))
    bars = drawn_bars(gen_s)
    assert [b[0] for b in bars.values()] == [[1.5], [1.5]]
    assert [b[1] for b in bars.values()] == [[pytest.approx((1.0, 2.0))], [pytest.approx((1.2, 1.8))]]
    assert fig.get_suptitle().endswith("(median and range of 3 runs)")


def test_bench_verl_plot_draws_the_median_and_range_of_skewed_runs(tmp_path, drawn_figures):
    """Runs far from symmetric: each bar is their median (not their mean), its line goes from their least to their
    most."""
    from infsample_lab.bench.in_verl import VerlBenchRow
    from infsample_lab.bench.plots import plot_bench_verl

    def row(backend, steps, repeat):
        return vars(VerlBenchRow(backend=backend, n=8, prompts=16, samples=128, gen_s=steps / 100,
                                 engine_steps=steps, preemptions=0, tokens_computed=1, generated_tokens=1,
                                 cached_prompt_tokens=0, peak_kv_blocks=1, kv_blocks=24, kv_block_size=128,
                                 verl_gen_s=1.0, repeat=repeat))

    plot_bench_verl([row("vllm", 100, 0), row("infinite", 90, 0), row("vllm", 400, 1), row("infinite", 300, 1),
                     row("vllm", 110, 2), row("infinite", 95, 2)], str(tmp_path / "b.png"))
    (fig,) = drawn_figures
    gen_s, steps = fig.axes
    assert drawn_bars(steps) == dict(zip(BENCH_LABELS, [([110.0], [(100.0, 400.0)]), ([95.0], [(90.0, 300.0)])]))
    bars = drawn_bars(gen_s)
    assert [b[0] for b in bars.values()] == [[1.1], [0.95]]
    assert [b[1] for b in bars.values()] == [[pytest.approx((1.0, 4.0))], [pytest.approx((0.9, 3.0))]]
    assert [t.get_text() for t in steps.get_xticklabels()] == ["n=8\n16 prompt(s)"]


def test_bench_verl_repeats_alternate_the_backends_and_print_the_summary(monkeypatch, capsys):
    """--repeats 2: the runs go verl, ours, verl, ours (machine drift hits both alike); the table has a repeat column
    and the summary one line per backend. The trainer run itself is faked (``fake_run_one``): the rest is the CLI's."""
    from infsample_lab.bench import in_verl

    calls = []

    def fake_run_one(backend, n, prompts, args, work, repeat=0):
        calls.append((backend, repeat))
        steps = 100 + 10 * repeat + (5 if backend == "infinite" else 0)
        return in_verl.VerlBenchRow(backend=backend, n=n, prompts=prompts, samples=128, gen_s=1.0,
                                    engine_steps=steps, preemptions=0, tokens_computed=1, generated_tokens=1,
                                    cached_prompt_tokens=0, peak_kv_blocks=1, kv_blocks=24, kv_block_size=128,
                                    verl_gen_s=1.0, repeat=repeat)

    monkeypatch.setattr(in_verl, "run_one", fake_run_one)
    assert main(["bench-verl", "--n", "16", "--repeats", "2"]) == 0
    assert calls == [("vllm", 0), ("infinite", 0), ("vllm", 1), ("infinite", 1)]
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["repeat", "backend"]
    summary = [line.split() for line in out.splitlines() if line.split()[:1] in (["vllm"], ["infinite"])
               and len(line.split()) == 11]
    assert [row[:6] for row in summary] == [["vllm", "16", "2", "105", "100", "110"],
                                            ["infinite", "16", "2", "110", "105", "115"]]


def test_bench_verl_row_bounds_each_training_step_on_its_own():
    """A run's row from verl's console lines: totals over its steps, and per step its engine steps and its lower
    bound, max(longest response, ceil(generated tokens / max_num_seqs))."""
    from infsample_lab.bench.in_verl import parse_step_lines, row_from_steps

    lines = ("(TaskRunnerV1 pid=1) step:2 - infsample/decode_steps:300 - infsample/total_tokens:1000 - "
             "response_length/max:160 - infsample/samples:128 - infsample/peak_kv_blocks:12 - timing_s/gen:1.0 - "
             "infsample/arrival_bound_steps:240\n"
             "(TaskRunnerV1 pid=1) step:1 - infsample/decode_steps:228 - infsample/total_tokens:3250 - "
             "response_length/max:77 - infsample/samples:128 - infsample/peak_kv_blocks:17 - timing_s/gen:2.5\n")
    row = row_from_steps("infinite", 16, 8, 16, parse_step_lines(lines))
    assert row.step_engine_steps == [228, 300]  # in step order
    assert row.step_lower_bound_steps == [204, 160]  # 3250 tokens over 16 rows; the 160-token response
    assert (row.engine_steps, row.lower_bound_steps, row.steps_vs_lower_bound) == (528, 364, 1.451)
    assert (row.samples, row.generated_tokens, row.peak_kv_blocks, row.verl_gen_s) == (256, 4250, 17, 3.5)
    # step 2's samples as they reached vLLM: 240; step 1 has no arrival figure, its plain bound stands
    assert row.step_arrival_bound_steps == [204, 240] and row.steps_vs_arrival_bound == round(528 / 444, 3)


def test_bench_verl_refuses_bad_sizes(capsys):
    assert main(["bench-verl", "--n", "0"]) == 2
    assert "--n, --steps, --slots, --kv-blocks and --repeats must be >= 1" in capsys.readouterr().err
    assert main(["bench-verl", "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err

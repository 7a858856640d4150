"""Pictures people would rather see than read: memory over time per policy, steps per seed per run, a length
predictor's predictions against the truth, memory against rollout.n (the GPU checks)."""

from __future__ import annotations


def plot_seed_sweep(panels: dict[str, list[dict]], runs: tuple[str, ...], path: str) -> None:
    """One panel per setting (title -> per-seed rows, each ``{run: {"steps": ..., ...}, "seed": ...}``): engine steps
    of every run on every seed, relative to the first run's (the baseline, drawn at 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    width = 0.8 / (len(runs) - 1)
    for ax, (title, rows) in zip(axes[0], panels.items()):
        seeds = [r["seed"] for r in rows]
        for i, run in enumerate(runs[1:]):
            ratio = [r[run]["steps"] / r[runs[0]]["steps"] for r in rows]
            ax.bar([k + (i - (len(runs) - 2) / 2) * width for k in range(len(seeds))], ratio, width, label=run)
        ax.axhline(1.0, color="black", linewidth=1, label=f"{runs[0]} (= 1)")
        ax.set_xticks(range(len(seeds)), [str(s) for s in seeds])
        ax.set_xlabel("seed")
        ax.set_ylabel(f"engine steps / {runs[0]}'s")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0.8, max(1.5, ax.get_ylim()[1]))
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(runs), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_predictor_evaluation(evaluation, path: str) -> None:
    """``infsample eval-predictor --plot``: left, each test sample's predicted remaining length at k against its true
    one (log-log; on the diagonal a prediction is exact), ``learned`` and ``history``, Kendall tau in the legend;
    right, the decode steps the scheduler reaches with each predictor, relative to ``oracle``'s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e, scored = evaluation, evaluation.scored
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.3), gridspec_kw={"width_ratios": [1.25, 1]})
    if scored is not None and len(scored.true):
        for name, predicted, tau, style in (("history", scored.history, e.history_kendall_tau, dict(color="0.6")),
                                            (e.predictor, scored.learned, e.kendall_tau, dict(color="tab:blue"))):
            left.scatter(scored.true, predicted, s=9, alpha=0.55, label=f"{name} (tau {tau:.2f})", **style)
        lo = max(1.0, float(min(scored.true.min(), scored.learned.min(), scored.history.min())))
        hi = float(max(scored.true.max(), scored.learned.max(), scored.history.max()))
        left.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="exact")
        left.set_xscale("log")
        left.set_yscale("log")
        left.legend(fontsize=8, loc="upper left")
    left.set_xlabel(f"true remaining length after k={e.k} tokens")
    left.set_ylabel("predicted remaining length")
    left.set_title(f"{e.test_samples} test samples of unseen prompts", fontsize=10)
    left.grid(alpha=0.3, which="both")
    names = list(e.decode_steps)
    ratios = [e.decode_steps[n] / e.decode_steps["oracle"] for n in names]
    bars = right.bar(range(len(names)), ratios, color=["tab:blue", "0.6", "0.8", "black"][:len(names)])
    for bar, n in zip(bars, names):
        right.annotate(f"{e.decode_steps[n]}" + (f"\n{e.preemptions[n]} preempted" if e.preemptions.get(n) else ""),
                       (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    right.set_xticks(range(len(names)), [e.predictor if n == "learned" else n for n in names], fontsize=8)
    right.set_ylabel("decode steps / oracle's")
    right.set_ylim(min(0.9, min(ratios) - 0.05), max(ratios) * 1.12)
    right.set_title(f"infinite under {e.capacity}", fontsize=10)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_gpu_check(report: dict, path: str) -> None:
    """The GPU check's ``transformers`` report (``gpu_check_transformers``): per path, peak KV in use (solid) and peak
    device memory (dashed, where measured) against rollout.n, and decode steps against rollout.n. Rows a path
    skipped or could not run (out of memory) are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    paths = list(dict.fromkeys(k for r in rows for k, v in r.items() if isinstance(v, dict) and "decode_steps" in v))
    fig, (mem, steps) = plt.subplots(1, 2, figsize=(10, 4.2))
    for i, name in enumerate(paths):
        color = f"C{i}"
        ran = [(r["n"], r[name]) for r in rows if isinstance(r.get(name), dict) and "decode_steps" in r[name]]
        ns = [n for n, _ in ran]
        mem.plot(ns, [v["peak_kv_bytes"] / 2**20 for _, v in ran], "o-", color=color, label=f"{name}: KV in use")
        device = [(n, v["peak_gpu_memory_bytes"]) for n, v in ran if v.get("peak_gpu_memory_bytes")]
        if device:
            mem.plot(*zip(*[(n, b / 2**20) for n, b in device]), "s--", color=color, alpha=0.7,
                     label=f"{name}: device peak")
        steps.plot(ns, [v["decode_steps"] for _, v in ran], "o-", color=color, label=name)
    budget = (report["kv_budget_tokens"] * report["kv_bytes_per_token"] if "kv_budget_tokens" in report
              else report.get("kv_bytes"))  # (TransformersEngine's budget; vLLM's whole KV cache)
    if budget:
        mem.axhline(budget / 2**20, color="black", linewidth=0.8, linestyle=":", label="KV budget")
    all_n = sorted({r["n"] for r in rows})
    for ax, label in ((mem, "MiB"), (steps, "decode steps")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_n, [str(n) for n in all_n])
        ax.minorticks_off()
        ax.set_xlabel("rollout.n (samples per prompt)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    mem.set_ylim(bottom=0)
    mem.legend(fontsize=7)
    steps.legend(fontsize=8)
    model = report.get("model", {})
    fig.suptitle(f"{model.get('shape', '?')} on {report.get('device', '?')}: {rows[0]['prompts'] if rows else 0} "
                 f"prompts of {report.get('prompt_len')} tokens, up to {report.get('max_new_tokens')} new tokens "
                 f"({report.get('date', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bench_verl(rows: list[dict], path: str) -> None:
    """``infsample bench-verl``: the engine's rollout time and its steps per rollout.n, one bar per backend (the
    median of its runs, a line over their range where it ran more than once)."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = sorted({r["n"] for r in rows})
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        runs.setdefault((r["backend"], r["n"]), []).append(r)
    prompts = {r["n"]: r["prompts"] for r in rows}
    width = 0.8 / max(1, len(backends))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "gen_s", "engine wall time of the rollout (s)"),
                           (axes[1], "engine_steps", "engine steps")):
        for i, b in enumerate(backends):
            xs = [j + (i - (len(backends) - 1) / 2) * width for j in range(len(ns))]
            values = [[r[key] for r in runs.get((b, n), [])] or [0] for n in ns]
            mid = [statistics.median(v) for v in values]
            spread = [[m - min(v) for m, v in zip(mid, values)], [max(v) - m for m, v in zip(mid, values)]]
            ax.bar(xs, mid, width, yerr=spread if any(len(v) > 1 for v in values) else None, capsize=3,
                   label="verl rollout.name=vllm" if b == "vllm" else f"rollout.name={b} (vLLM)")
        ax.set_xticks(range(len(ns)), [f"n={n}\n{prompts[n]} prompt(s)" for n in ns])
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    most = max(len(v) for v in runs.values())
    fig.suptitle("verl's trainer on the tiny model, same prompts, max_num_seqs and vLLM KV pool"
                 + (f" (median and range of {most} runs)" if most > 1 else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_demo(rows: list[dict], path: str) -> None:
    """``make demo``: mean reward and the rollout's seconds per training step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["reward"] for r in rows], "o-", color="tab:green", label="mean reward")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward (right answers)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.bar(steps, [r["gen_s"] or 0 for r in rows], alpha=0.25, color="tab:blue", label="rollout seconds")
    right.set_ylabel("rollout seconds (the server's own)")
    ax.set_zorder(right.get_zorder() + 1)  # the reward line over the bars
    ax.patch.set_visible(False)
    lines = ax.get_legend_handles_labels()
    bars = right.get_legend_handles_labels()
    ax.legend(lines[0] + bars[0], lines[1] + bars[1], loc="upper left")
    ax.set_title("GRPO through verl with rollout.name=infinite: the tiny model learns to count")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_running_per_replica(timelines: dict[str, list[list[tuple[float, int]]]], path: str, title: str) -> None:
    """One panel per backend: running samples of each replica over modeled seconds (the tail at a glance)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(timelines), 1, figsize=(9, 2.4 * len(timelines)), sharex=True, squeeze=False)
    for ax, (name, replicas) in zip(axes[:, 0], timelines.items()):
        for i, points in enumerate(replicas):
            if points:
                t, running = zip(*points)
                ax.step(t, running, where="post", linewidth=0.9, label=f"replica {i}" if len(replicas) <= 8 else None)
        ax.set_ylabel(f"{name}\nrunning")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("modeled seconds")
    axes[0, 0].set_title(title)
    if len(timelines) and len(next(iter(timelines.values()))) <= 8:
        axes[0, 0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

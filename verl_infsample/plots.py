"""Pictures people would rather see than read: memory over time per policy, steps per seed per run."""

from __future__ import annotations


def plot_kv_timelines(timelines: dict[str, list[tuple[int, float]]], path: str, title: str, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, points in timelines.items():
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, label=name, linewidth=1.2)
    ax.set_xlabel("decode step")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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

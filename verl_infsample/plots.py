"""Pictures people would rather see than read: memory over time per policy."""

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

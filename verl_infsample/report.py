"""Text and picture output shared by the command lines (``infsample``, the lab's commands, ``scripts/``): an aligned
text table of dict rows (``format_table``), a tqdm progress bar shown on a terminal only (``progress``) and a PNG of
KV use per decode step (``plot_kv_timelines``; matplotlib, the ``plot`` extra, imported only when called)."""

from __future__ import annotations

import sys


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain aligned text table (what people read in a terminal)."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def progress(items, desc: str):
    """``items`` with a tqdm bar on a terminal (none in logs)."""
    from tqdm import tqdm

    return tqdm(items, desc=desc, file=sys.stderr, leave=False, disable=not sys.stderr.isatty())


def plot_kv_timelines(timelines: dict[str, list[tuple[int, float]]], path: str, title: str, unit: str) -> None:
    """One line per policy: ``unit`` in use over decode steps. The PNG's text metadata carries the title (``Title``)
    and, per line, its last decode step and its peak (``Description``, JSON), so the file says what it shows."""
    import json

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
    lines = {line.get_label(): {"last_step": int(line.get_xdata()[-1]), "peak": float(max(line.get_ydata()))}
             for line in ax.get_lines()}
    fig.savefig(path, dpi=120, metadata={"Title": title, "Description": json.dumps(lines)})
    plt.close(fig)

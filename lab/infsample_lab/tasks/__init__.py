"""Example tasks as data + rule rewards: knights-and-knaves logic puzzles, GSM8K, the demo's chain arithmetic, and
arithmetic for a tool agent with a calculator (``calculator``: the safe evaluator; ``calculator_tool``: it as a verl
tool, which imports verl).

Pure Python + numpy at import (no torch, Ray or verl): verl is imported only when :func:`compute_score` falls back
to verl's own ``default_compute_score`` for a data source other than ours.
"""

from __future__ import annotations

from typing import Any

from . import calculator, chains, gsm8k, knights_knaves, tool_arithmetic


def compute_score(data_source: Any = None, solution_str: Any = None, ground_truth: Any = None,
                  extra_info: Any = None, **kwargs: Any):
    """One custom reward for mixed data: knights_knaves puzzles, chains and tool arithmetic here, every other data
    source (openai/gsm8k, ...) through verl's ``verl.utils.reward_score.default_compute_score``. Same calling
    convention as verl's reward managers:
    ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **kwargs)``."""
    if data_source == knights_knaves.DATA_SOURCE:
        return knights_knaves.compute_score(data_source=data_source, solution_str=solution_str,
                                            ground_truth=ground_truth, extra_info=extra_info, **kwargs)
    if data_source == chains.DATA_SOURCE:
        return chains.compute_score(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                                    extra_info=extra_info, **kwargs)
    if data_source == tool_arithmetic.DATA_SOURCE:
        return tool_arithmetic.compute_score(data_source=data_source, solution_str=solution_str,
                                             ground_truth=ground_truth, extra_info=extra_info, **kwargs)
    from verl.utils.reward_score import default_compute_score

    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


def write_parquet(rows: list[dict], path) -> None:
    """Write verl rows to ``path`` (parent folders created) with pandas/pyarrow: nested dicts become structs, the
    chat prompt a list of structs, which is what verl's RLHFDataset (``datasets`` parquet loader) reads."""
    from pathlib import Path

    import pandas as pd

    if not rows:
        raise ValueError(f"no rows to write to {path}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


__all__ = ["calculator", "chains", "compute_score", "gsm8k", "knights_knaves", "tool_arithmetic", "write_parquet"]

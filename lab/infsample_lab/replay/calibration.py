"""The step-cost model against published GPU figures: the points (``published_gpu_steps.json``), what the model
charges for each, and the fit of :class:`~infsample_lab.replay.hardware.Calibration`'s defaults to them.

``python -m infsample_lab.replay.calibration`` prints the table of ``docs/step_model.md`` (model against each
point, and their ratio) and the fit; ``--calibration FILE`` prints it for a calibration file's values instead of
the defaults. ``--add-gpu-check REPORT`` loads a GPU check's real decode steps (``scripts/gpu_check.sh --out
REPORT`` on one GPU) into the points file, beside the published ones, as a source of their own.
``tests/test_replay.py`` holds the model within 15% of every point through :func:`table`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .hardware import GPUS, MODELS, Calibration, StepCostModel

POINTS_FILE = Path(__file__).with_name("published_gpu_steps.json")
FITTED = ("bandwidth_efficiency", "token_flop_efficiency", "step_overhead_s")  # what the points determine


@dataclass(frozen=True)
class PublishedPoint:
    """One published figure. ``kind`` ``step``: one engine step of ``rows`` rows, each computing
    ``tokens_per_row`` tokens on ``context`` cached ones. ``end_to_end``: one batch of ``rows`` prompts of
    ``prompt_tokens``, each generating ``output_tokens`` (one prefill step, then decode steps), drafts off."""

    source: str
    gpu: str
    model: str
    kind: str
    rows: int
    drafts: str
    seconds: float
    tokens_per_row: int = 1
    context: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    @property
    def label(self) -> str:
        if self.kind == "step":
            return f"{self.rows} x {self.tokens_per_row} tokens, context {self.context}"
        return f"{self.rows} x ({self.prompt_tokens} in, {self.output_tokens} out), end to end"


def published_points(path: str | Path = POINTS_FILE) -> tuple[dict, list[PublishedPoint]]:
    """The sources (title, arXiv id or address, what is measured) and the points of ``path``."""
    raw = json.loads(Path(path).read_text())
    points = [PublishedPoint(**p) for p in raw["points"]]
    for p in points:
        if p.source not in raw["sources"] or p.gpu not in GPUS or p.model not in MODELS:
            raise ValueError(f"{path}: point {p} names an unknown source, GPU or model")
        if p.kind not in ("step", "end_to_end") or not p.seconds > 0:
            raise ValueError(f"{path}: point {p}: kind must be step or end_to_end, seconds > 0")
    return raw["sources"], points


def gpu_check_points(report: dict) -> tuple[str, dict, list[PublishedPoint]]:
    """A GPU check's report (``scripts/gpu_check.sh --out``) as a source and its step points: per backend and band
    of rows, the mean of the rollout part's real decode steps (every row one token, drafts off). Refuses a dry run
    (its seconds are the CPU's) and a report without a rollout part that ran."""
    if report.get("dry_run"):
        raise ValueError("--add-gpu-check: the report is a dry run's (its seconds are this CPU's): run "
                         "scripts/gpu_check.sh --out REPORT on the GPU")
    rollout = report.get("parts", {}).get("rollout", {})
    if not rollout.get("ok") or "gpu" not in rollout:
        raise ValueError("--add-gpu-check: the report has no rollout part that ran: scripts/gpu_check.sh "
                         "--parts rollout --out REPORT")
    key = f"gpu-check-{report['date']}-{rollout['gpu']}"
    source = {"title": f"this project's GPU check on {report['device']}", "date": report["date"],
              "command": report["command"],
              "figure": f"vLLM's engine steps of {rollout['model']}'s shape ({rollout['weights']}, "
                        f"{rollout['dtype']}), rollout.name=vllm and infinite on one trace",
              "evaluated": "a measurement: per backend and band of rows, the mean of its decode steps' wall time",
              "measured": "one engine step in which every row decodes one token, drafts off (context: the mean "
                          "tokens a row has cached)"}
    points = [PublishedPoint(source=key, gpu=rollout["gpu"], model=rollout["model"], kind="step",
                             rows=max(1, round(p["rows"])), drafts="off", seconds=p["seconds"],
                             context=round(p["context"]))
              for backend in rollout["backends"].values() for p in backend.get("decode_points", [])]
    if not points:
        raise ValueError("--add-gpu-check: the report's rollout part holds no decode steps (decode_points)")
    return key, source, points


def add_points(path: str | Path, key: str, source: dict, points: list[PublishedPoint]) -> None:
    """Write ``source`` under ``key`` and ``points`` into the points file ``path`` (those of an earlier ``key``
    replaced), one point a line as the file keeps them."""
    raw = json.loads(Path(path).read_text())
    raw["sources"][key] = source
    steps = [{k: v for k, v in asdict(p).items() if k not in ("prompt_tokens", "output_tokens")} for p in points]
    raw["points"] = [p for p in raw["points"] if p["source"] != key] + steps
    head = json.dumps({"what": raw["what"], "sources": raw["sources"]}, indent=1)[:-2]  # its closing brace off
    lines = ",\n".join("  " + json.dumps(p) for p in raw["points"])
    Path(path).write_text(f'{head},\n "points": [\n{lines}\n ]\n}}\n')
    published_points(path)  # what was written reads back


def modeled_seconds(point: PublishedPoint, calibration: Calibration = Calibration()) -> float:
    """What the cost model charges for ``point``. A step: :meth:`StepCostModel.seconds` (the GPU step and its
    overhead; the LM head at every verified position; the published step excludes drafting, as this does). End to
    end: :meth:`StepCostModel.step_seconds` of the prefill step plus :meth:`StepCostModel.decode_run_seconds` of
    the ``output_tokens - 1`` decode steps after it."""
    cost = StepCostModel(GPUS[point.gpu], MODELS[point.model], 1, calibration)
    r = point.rows
    if point.kind == "step":
        k = point.tokens_per_row
        return cost.seconds(np.full(r, float(k)), np.full(r, float(point.context)), r * k)
    prompts = np.full(r, float(point.prompt_tokens))
    prefill = cost.step_seconds(cost.seconds(prompts, np.zeros(r), r), r)
    return prefill + cost.decode_run_seconds(prompts, point.output_tokens - 1)


def table(calibration: Calibration = Calibration(), points: list[PublishedPoint] | None = None) -> list[dict]:
    """Per point: its source and setting, the published and the modeled seconds, modeled / published."""
    points = published_points()[1] if points is None else points
    out = []
    for p in points:
        m = modeled_seconds(p, calibration)
        out.append({"source": p.source, "gpu": p.gpu, "model": p.model, "setting": p.label, "drafts": p.drafts,
                    "published_ms": round(1e3 * p.seconds, 3), "modeled_ms": round(1e3 * m, 3),
                    "ratio": round(m / p.seconds, 3)})
    return out


def fit(points: list[PublishedPoint] | None = None, base: Calibration = Calibration()) -> Calibration:
    """``base`` with :data:`FITTED` fields least-squares fitted to ``points``' log ratios (Levenberg-Marquardt on
    their logarithms); the efficiencies are held to at most 1."""
    points = published_points()[1] if points is None else points
    published = np.log([p.seconds for p in points])

    def calib(x: np.ndarray) -> Calibration:
        v = np.exp(x)
        return replace(base, **{k: float(min(v[i], 1.0) if k.endswith("efficiency") else v[i])
                                for i, k in enumerate(FITTED)})

    def residuals(x: np.ndarray) -> np.ndarray:
        c = calib(x)
        return np.log([modeled_seconds(p, c) for p in points]) - published

    x = np.log([getattr(base, k) for k in FITTED])
    r, damping = residuals(x), 1e-3
    for _ in range(200):
        jac = np.stack([(residuals(x + h) - r) / 1e-6 for h in np.eye(len(x)) * 1e-6], axis=1)
        a = jac.T @ jac
        step = np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -jac.T @ r)
        trial = residuals(x + step)
        if trial @ trial < r @ r:
            x, r, damping = x + step, trial, damping / 3
            if np.max(np.abs(step)) < 1e-9:
                break
        else:
            damping *= 10
            if damping > 1e12:
                break
    return calib(x)


def markdown(rows: list[dict]) -> str:
    lines = ["| source | GPU | setting | drafts | published ms | modeled ms | modeled / published |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['source']} | {r['gpu']} | {r['setting']} | {r['drafts']} | {r['published_ms']:.3f} | "
              f"{r['modeled_ms']:.3f} | {r['ratio']:.3f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infsample_lab.replay.calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", help="a JSON file of Calibration fields (default: the defaults)")
    ap.add_argument("--add-gpu-check", metavar="REPORT",
                    help="load a GPU check's real decode steps (scripts/gpu_check.sh --out REPORT) into --points")
    ap.add_argument("--points", default=str(POINTS_FILE), help="the points file (default: the published points)")
    a = ap.parse_args(argv)
    if a.add_gpu_check:
        try:
            key, source, added = gpu_check_points(json.loads(Path(a.add_gpu_check).read_text()))
        except (OSError, ValueError, KeyError) as e:
            ap.error(str(e) if isinstance(e, ValueError) else f"--add-gpu-check {a.add_gpu_check}: {e!r}")
        add_points(a.points, key, source, added)
        print(f"{a.points}: {len(added)} points of {key}")
    calibration = Calibration.from_file(a.calibration) if a.calibration else Calibration()
    points = published_points(a.points)[1]
    rows = table(calibration, points)
    print(markdown(rows))
    worst = max(rows, key=lambda r: abs(math.log(r["ratio"])))
    print(f"\nworst: {worst['ratio']:.3f} ({worst['source']}, {worst['setting']}, drafts {worst['drafts']})")
    fitted = fit(points, base=calibration)
    print("fit to the points: " + ", ".join(f"{k}={getattr(fitted, k):.4g}" for k in FITTED))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

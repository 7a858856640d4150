"""``learned``: a length predictor that learns the policy online, from every finished rollout.

A sample's remaining length is predicted at checkpoints k = 0 (before its first token), 1, then 4, 16, 64, ... (powers
of 4 below K) and K generated tokens (K = 8: 0, 1, 4, 8; K = 2: 0, 1, 2). Under M slots a running sample's prediction
is read by nothing (its slot is its own until it ends), so there engines report only at 1 (what the plan reads) and K
(where the predictor is scored): ``slot_checkpoints``. Under a KV budget the admission projection reads every
refinement. The k = 1 prediction usually comes before the plan: an engine with a first-token lookahead
(``Scheduler(first_tokens=...)``; the transformers engine and the trace replay) draws every sample's first token from
its group's prompt logits, so the plan sees how each sample opens and can start the long ones first; a waiting
sample's first-token features follow its finished siblings.

Each checkpoint has its own ridge regressor on log(remaining tokens), over ``features.feature_rows``: the prompt
(length, hashed token n-grams), the prompt's earlier rollouts, the group's finished siblings and the sample's own
tokens so far (token n-grams, log-probs, the entropy and stop probability of the distribution it draws from, and the
opening's track record: the mean log remaining length, at this checkpoint, of earlier samples that began with the
same first tokens). Between checkpoints a prediction holds: engines report a sample's tokens only when it reaches a
checkpoint (``token_checkpoints``), so most decode steps cost nothing. Samples still waiting without a lookahead
share one prediction per group (they differ in nothing yet), refreshed when a sibling finishes.

Learning: when a sample finishes, its true length labels the feature snapshot it left at each checkpoint it passed
(so each regressor sees exactly the samples that were still running at its k, as at prediction time). Sufficient
statistics decay by ``forget`` per observation (memory of about 1 / (1 - forget) samples per checkpoint), folded in
a few rows at a time when the regressor is next solved. The policy changes every training step, faster than such a
memory follows, so each batch starts with a *drift* term: the regressors' mean residual on the previous batch, as
they stand now (two time scales: the drift moves at once, the regressors catch up and the drift falls back to ~0).
Until a checkpoint has seen ``min_samples`` samples its predictions come from the core's ``history`` predictor.
``save``/``load`` (or ``state=PATH`` in the spec) carry the state across training steps and restarts.

Spec: ``learned[:k=K][,forget=F][,min=N][,q=Q][,state=PATH]``, e.g. ``learned:k=8``, ``learned:q=0.8`` (predict the
80% quantile: reserves more KV under a KV budget) or ``learned:state=/ckpt/len.npz``.

The ridge systems (``DIM`` = 64 unknowns) are solved directly, in about 40 us. OpenBLAS solves a system of fewer
than 10,000 entries on one thread; at 100 x 100 it spins up its thread pool, which on a loaded machine cost
milliseconds a solve (why they were once solved by conjugate gradients, at ~200 us and to only ~1e-5).
"""

from __future__ import annotations

import json
import math
from operator import mul
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Sequence

import numpy as np

from ..core.predictor import HistoryPredictor, LengthPredictor
from ..core.sample import Group, Sample
from .features import (DIM, NO_TOKENS, SIBLINGS, TOKENS, GroupContext, TokenWindow, feature_rows, group_features,
                       prompt_vector, token_features)

STATE_VERSION = 3  # 3: checkpoint k = 1 (first-token lookahead)
DRIFT_MIN = 8  # samples a checkpoint needs in a batch before its mean residual becomes the next batch's drift
PREFIX_TOKENS = (2, 1)  # openings tracked: the first two tokens, else the first one
PREFIX_MIN = 4  # samples an opening needs before its mean is a feature
PREFIX_KEYS = 65_536  # openings remembered per checkpoint (the oldest go first)


def checkpoints_up_to(k: int) -> tuple[int, ...]:
    """0, 1, then powers of 4 below ``k``, then ``k``: where predictions refine (few: each costs a feature vector)."""
    if k < 1:
        raise ValueError(f"predictor 'learned:k=K' needs K >= 1, got {k}")
    points, p = [0, 1], 4
    while p < k:
        points.append(p)
        p *= 4
    return tuple(points + [k] if k > 1 else points)


@dataclass
class _LiveSample:
    """A started sample of the current batch: the feature snapshots it left at checkpoints."""

    generated: int = 0  # tokens at its latest checkpoint
    # (checkpoint index, its own features (``token_features``), sibling features when it was taken)
    snapshots: list[tuple[int, Sequence[float], tuple]] = field(default_factory=list)
    opening: tuple[int, ...] = ()  # its first tokens (``PREFIX_TOKENS[0]`` of them, fewer before)
    cached: float | None = None  # prediction at its latest checkpoint (None: recompute)
    siblings: int = 0  # its group's finished samples when the snapshots were taken


class LearnedPredictor(LengthPredictor):
    """Online ridge regressors on log remaining length, one per checkpoint; ``history`` until trained."""

    name = "learned"
    reads_tokens = True
    repredicts_outgrown = True
    plans_on_first_token = True  # asks engines for the first-token lookahead (``Scheduler(first_tokens=...)``)

    def __init__(self, max_len: int, *, k: int = 16, forget: float = 0.998, ridge: float = 2.0,
                 prompt_ridge: float = 10.0, min_samples: int = 32, refit_every: int = 16, quantile: float = 0.5,
                 state_path: str | Path | None = None):
        """``ridge``: the token checkpoints' penalty (many distinct samples); ``prompt_ridge``: k = 0's, where a batch
        has few distinct prompts and their hashed n-grams overfit without a stronger one. ``quantile``: which
        quantile of the remaining length to predict (log-normal around the regression, its spread the residuals'):
        0.5 the median; higher reserves more KV per sample under a KV budget, so fewer samples outgrow it."""
        if not 0 < quantile < 1:
            raise ValueError(f"predictor 'learned:q=Q' needs 0 < Q < 1, got {quantile}")
        if not 0 < forget <= 1:
            raise ValueError(f"predictor 'learned:forget=F' needs 0 < F <= 1, got {forget}")
        if min_samples < 1:
            raise ValueError(f"predictor 'learned:min=N' needs N >= 1, got {min_samples}")
        self.max_len, self.k, self.forget, self.ridge = max_len, k, forget, ridge
        self.prompt_ridge = prompt_ridge
        self.quantile, self._z = quantile, NormalDist().inv_cdf(quantile)
        self.min_samples, self.refit_every = min_samples, refit_every
        self.checkpoints = checkpoints_up_to(k)
        self.token_checkpoints = frozenset(self.checkpoints[1:])  # where engines report a sample's tokens
        self.slot_checkpoints = frozenset({1, k})  # under M slots: what the plan reads, and the scored k
        self.name = f"learned:k={k}" + (f",q={quantile:g}" if quantile != 0.5 else "")
        c = len(self.checkpoints)
        # decayed sums X^T X, X^T y; new rows wait in ``_rows`` and are folded in (one matrix product) when the
        # regressor is next solved: an observation costs a list append, not an outer product
        self._A = np.zeros((c, DIM, DIM))
        self._b = np.zeros((c, DIM))
        self._yy = np.zeros((c, 2))  # decayed sum of y^2 and decayed count: the residuals' spread
        # (group context, own features, sibling features, y): the rows are built when folded
        self._rows: list[list[tuple[GroupContext, Sequence[float], tuple, float]]] = [[] for _ in range(c)]
        self._seen = [0] * c  # samples each checkpoint has learned from (no decay; plain ints: read every step)
        self._drift = np.zeros(c)  # the last batch's mean residual (log tokens), added to predictions: see start_batch
        self._batch_x = np.zeros((c, DIM))  # this batch's samples, per checkpoint: sum of features,
        self._batch_y = np.zeros((c, 2))  # (sum of log remaining lengths, count)
        self._version = [0] * c  # bumped by each solve: a group's cached w . group features is stale
        self._reset_solutions()
        self._log_max = math.log(max_len)
        self._eye = np.eye(DIM)
        self._checkpoint_index = {k: ci for ci, k in enumerate(self.checkpoints)}
        self.history = HistoryPredictor(max_len)
        self._history_log: dict[str, list[float]] = {}  # prompt id -> [sum of log length, count]
        # per checkpoint: opening (first tokens) -> [decayed sum of log remaining length, decayed count]
        self._openings: list[dict[tuple[int, ...], list[float]]] = [{} for _ in self.checkpoints]
        self._prompts: dict[str, np.ndarray] = {}  # prompt id -> prompt_vector (latest batch's prompts)
        self._groups: dict[str, GroupContext] = {}
        self._live: dict[tuple[str, int], _LiveSample] = {}
        self.observed = 0
        self._saved_at = 0
        self.state_path = Path(state_path) if state_path else None
        if self.state_path is not None and self.state_path.exists():
            self.load(self.state_path)

    # --- hooks the scheduler and engines call ------------------------------------------------------------------
    def observe_prompt(self, prompt_id: str, token_ids: Sequence[int]) -> None:
        """An engine's prompt tokens, before the batch is planned (prompt features; optional)."""
        self._prompts[str(prompt_id)] = prompt_vector(token_ids)
        if len(self._prompts) > 65_536:  # bounded: the oldest prompts go first
            del self._prompts[next(iter(self._prompts))]

    def start_batch(self, groups: Sequence[Group]) -> None:
        """A new rollout: per-batch state (siblings, in-flight samples) starts empty; persist what was learned."""
        self._groups = {g.prompt_id: self._new_context(g) for g in groups}
        self._live = {}
        self.history.start_batch(groups)
        self._update_drift()
        if self.state_path is not None and self.observed > self._saved_at:
            self.save(self.state_path)

    def join_batch(self, groups: Sequence[Group]) -> None:
        """Groups that joined the running rollout: contexts of their own, beside the batch's."""
        for g in groups:
            self._groups.setdefault(g.prompt_id, self._new_context(g))

    def predict(self, group: Group, sample: Sample | None) -> float:
        ctx = self._context(group)
        live = self._live.get((group.prompt_id, sample.index)) if sample is not None else None
        if live is None or not live.snapshots:  # not started: the group's shared prediction
            if ctx.waiting is None or ctx.waiting[0] != ctx.finished:
                prediction = self._final(group, sample, ctx, 0, NO_TOKENS, ctx.siblings, 0)
                ctx.waiting = (ctx.finished, ctx.siblings, prediction)
            return ctx.waiting[2]
        if sample.generated == 0 and live.siblings != ctx.finished:  # not started: its siblings as of now
            live.snapshots = [(ci, own, ctx.siblings) for ci, own, _ in live.snapshots]
            live.siblings, live.cached = ctx.finished, None
        if live.cached is None:
            ci, own, siblings = live.snapshots[-1]
            live.cached = self._final(group, sample, ctx, ci, own, siblings, live.generated)
        return live.cached

    def _final(self, group: Group, sample: Sample | None, ctx: GroupContext, ci: int, own: Sequence[float],
               siblings: tuple, generated: int) -> float:
        final = self._regress(ci, ctx, own, siblings)
        if final is None:  # this checkpoint has not seen enough samples yet
            final = self.history.predict(group, sample)
        return float(min(self.max_len, max(generated + 1.0, final)))

    def observe_tokens(self, group: Group, sample: Sample, window: TokenWindow) -> bool:
        """A running sample reached a checkpoint (``len(window.token_ids)`` tokens): snapshot its features and
        re-predict. True when its prediction changed (always, at a checkpoint)."""
        key = (group.prompt_id, sample.index)
        live = self._live.get(key)
        if live is None:
            live = self._live[key] = _LiveSample()
        ctx = self._context(group)
        if not live.snapshots:  # the k = 0 snapshot: the sample as it started, siblings as of now
            live.snapshots.append((0, NO_TOKENS, ctx.siblings))
        n = len(window.token_ids)
        if n not in self.token_checkpoints or n <= live.generated:
            return False
        live.opening = tuple(int(t) for t in window.token_ids[:PREFIX_TOKENS[0]])
        ci = self._checkpoint_index[n]
        live.snapshots.append((ci, token_features(window, self._opening_mean(ci, live.opening)), ctx.siblings))
        live.generated, live.cached, live.siblings = n, None, ctx.finished
        return True

    def refresh(self, group: Group, sample: Sample) -> None:
        """A paused sample's latest snapshot takes its siblings as they are now, and the regressors as they are."""
        live = self._live.get((group.prompt_id, sample.index))
        if live is None or not live.snapshots:
            return
        ctx = self._context(group)
        if live.siblings != ctx.finished:
            ci, own, _ = live.snapshots[-1]
            live.snapshots[-1] = (ci, own, ctx.siblings)
            live.siblings = ctx.finished
        live.cached = None

    def revision(self) -> int:
        """The regressors' solves so far (each changes every prediction), after re-solving each that has
        ``refit_every`` new samples waiting (or has left the ``history`` fallback): what the step's first samples
        taught counts for the samples still paused."""
        for ci in range(len(self.checkpoints)):
            if self._ready[ci] and (len(self._rows[ci]) >= self.refit_every or not self._solved[ci]):
                self._solve(ci)
        return sum(self._version)

    def predict_outgrown(self, group: Group, sample: Sample) -> float:
        """Past its prediction a sample is predicted as ``history`` does (earlier lengths beyond what it has)."""
        return self.history.predict_outgrown(group, sample)

    def observe(self, group: Group, sample: Sample | None, length: int) -> None:
        """A sample finished with ``length`` tokens: label its snapshots, update history and its siblings' context."""
        self.history.observe(group, sample, length)
        h = self._history_log.setdefault(group.prompt_id, [0.0, 0])
        h[0] += math.log(length)
        h[1] += 1
        ctx = self._context(group)
        live = self._live.pop((group.prompt_id, sample.index), None) if sample is not None else None
        if live is not None and live.snapshots:
            snapshots = live.snapshots
        else:  # no tokens seen (a simulator): the features it was predicted from
            snapshots = [(0, NO_TOKENS, ctx.waiting[1] if ctx.waiting is not None else ctx.siblings)]
        opening = live.opening if live is not None else ()
        log_length = math.log(length)
        for ci, own, siblings in snapshots:
            remaining = length - self.checkpoints[ci]
            if remaining >= 1:
                y = math.log(remaining) if ci else log_length
                self._learn(ci, (ctx, own, siblings, y))
                if ci and opening:
                    self._learn_opening(ci, opening, y)
        ctx.sibling_finished(log_length)
        self.observed += 1

    # --- the regressors ------------------------------------------------------------------------------------------
    def _learn(self, ci: int, row: tuple[GroupContext, Sequence[float], tuple, float]) -> None:
        self._rows[ci].append(row)
        self._seen[ci] += 1
        if not self._ready[ci] and self._seen[ci] >= self.min_samples:
            self._ready[ci] = True

    def _fold(self, ci: int) -> None:
        """Fold the waiting rows into the decayed sums: each observation decays the ones before it by ``forget``,
        so m new rows weigh forget^(m-1), ..., 1 and the old sums forget^m."""
        rows, self._rows[ci] = self._rows[ci], []
        if not rows:
            return
        contexts, own, siblings, y = zip(*rows)
        X = feature_rows(contexts, siblings, own)
        y = np.array(y)
        weights = self.forget ** np.arange(len(rows) - 1, -1, -1, dtype=float)
        decay = self.forget ** len(rows)
        Xw = X * weights[:, None]
        A, b = self._A[ci], self._b[ci]
        A *= decay
        A += Xw.T @ X
        b *= decay
        b += Xw.T @ y
        self._yy[ci] = decay * self._yy[ci] + (float(weights @ (y * y)), float(weights.sum()))
        self._batch_x[ci] += X.sum(axis=0)
        self._batch_y[ci] += (float(y.sum()), float(len(rows)))

    def _update_drift(self) -> None:
        """The policy moves every training step and the regressors, remembering ~1 / (1 - forget) samples, follow
        slowly: the regressors' mean residual on the last batch, as they stand now, shifts the next batch's
        predictions; it falls back to ~0 as they catch up. Whole batches only: within a batch the short samples
        finish first, so a running mean would swing from too short to too long. The mean residual is linear in w:
        mean(y) - w . mean(x), from two running sums."""
        for ci in range(len(self.checkpoints)):
            self._fold(ci)
        for ci in np.flatnonzero(self._batch_y[:, 1] >= DRIFT_MIN):
            if self._seen[ci] >= self.min_samples:
                self._solve(int(ci))
                self._drift[ci] = (self._batch_y[ci, 0] - float(self._w[ci] @ self._batch_x[ci])) / self._batch_y[ci, 1]
                self._set_offset(ci)
        self._batch_x[:] = 0.0
        self._batch_y[:] = 0.0

    def _opening_mean(self, ci: int, opening: tuple[int, ...]) -> float | None:
        """Mean log remaining length at checkpoint ``ci`` of earlier samples with this opening (the longest tracked
        prefix with ``PREFIX_MIN`` samples), or None."""
        for n in PREFIX_TOKENS:
            stat = self._openings[ci].get(opening[:n]) if len(opening) >= n else None
            if stat is not None and stat[1] >= PREFIX_MIN:
                return stat[0] / stat[1]
        return None

    def _learn_opening(self, ci: int, opening: tuple[int, ...], y: float) -> None:
        table = self._openings[ci]
        for n in PREFIX_TOKENS:
            if len(opening) < n:
                continue
            stat = table.pop(opening[:n], None) or [0.0, 0.0]  # re-inserted last: the most recent
            stat[0] = stat[0] * self.forget + y
            stat[1] = stat[1] * self.forget + 1.0
            table[opening[:n]] = stat
        while len(table) > PREFIX_KEYS:
            del table[next(iter(table))]

    def _regress(self, ci: int, ctx: GroupContext, own: Sequence[float], siblings: tuple) -> float | None:
        """Predicted final length from checkpoint ``ci``'s regressor for a sample of ``ctx``'s group with these
        features of its own and siblings, or None while it is untrained. w . x in its three parts, in plain floats
        (no array per prediction: see ``features.feature_rows``)."""
        if not self._ready[ci]:
            return None
        if len(self._rows[ci]) >= self.refit_every or not self._solved[ci]:
            self._solve(ci)
        version, group_term = ctx.dots.get(ci, (None, 0.0))
        if version != self._version[ci]:
            group_term = float(self._w[ci] @ group_features(ctx))
            ctx.dots[ci] = (self._version[ci], group_term)
        a, b, c = self._w_siblings[ci]
        y = (group_term + (a * siblings[0] + b * siblings[1] + c * siblings[2]) + sum(map(mul, self._w_own[ci], own))
             + self._offset[ci])
        return self.checkpoints[ci] + math.exp(min(max(y, 0.0), self._log_max))

    def _solve(self, ci: int) -> None:
        """w = (A + ridge I)^-1 b, directly (see the module's last paragraph)."""
        self._fold(ci)
        A, b, ridge = self._A[ci], self._b[ci], self.ridge if ci else self.prompt_ridge
        w = np.linalg.solve(A + ridge * self._eye, b)
        self._w[ci], self._solved[ci] = w, True
        self._w_siblings[ci] = tuple(w[SIBLINGS:TOKENS].tolist())
        self._w_own[ci] = w[TOKENS:].tolist()
        self._version[ci] += 1
        yy, n = self._yy[ci]
        if n > 0:  # mean squared residual: (sum y^2 - 2 w.X^T y + w.X^T X w) / n
            self._sigma[ci] = math.sqrt(max(0.0, (yy - 2 * float(w @ b) + float(w @ (A @ w))) / n))
        self._set_offset(ci)

    def _set_offset(self, ci: int) -> None:
        """What every prediction at ``ci`` adds to w . x: the drift, and the quantile's share of the spread."""
        self._offset[ci] = float(self._drift[ci] + self._z * self._sigma[ci])

    def _reset_solutions(self) -> None:
        """No regressor solved yet (a new or loaded state): each is solved when first read. What a prediction reads
        is kept in plain floats (a prediction is a few products and sums of them: see ``_regress``)."""
        c = len(self.checkpoints)
        self._sigma = np.zeros(c)  # std of log remaining length around each regressor (at its last solve)
        self._w = np.zeros((c, DIM))
        self._solved = [False] * c
        self._ready = [bool(n >= self.min_samples) for n in self._seen]  # left the ``history`` fallback
        self._w_siblings = [(0.0, 0.0, 0.0)] * c  # the sibling features' weights
        self._w_own = [list(NO_TOKENS)] * c  # the sample's own features' weights
        self._offset = [0.0] * c  # ``_set_offset``
        for ci in range(c):
            self._set_offset(ci)

    def refit(self) -> None:
        """Solve every trained regressor now (normally each waits for ``refit_every`` new samples)."""
        for ci in range(len(self.checkpoints)):
            if self._seen[ci] >= self.min_samples:
                self._solve(ci)

    def trained_checkpoints(self) -> list[int]:
        """Checkpoints (tokens) whose regressor has left the ``history`` fallback."""
        return [k for k, n in zip(self.checkpoints, self._seen) if n >= self.min_samples]

    # --- per-batch context ---------------------------------------------------------------------------------------
    def _new_context(self, group: Group) -> GroupContext:
        h = self._history_log.get(group.prompt_id)
        return GroupContext(size=group.size, prompt_len=group.prompt_len, prompt=self._prompts.get(group.prompt_id),
                            history_log_len=h[0] / h[1] if h else None)

    def _context(self, group: Group) -> GroupContext:
        ctx = self._groups.get(group.prompt_id)
        if ctx is None:  # used without start_batch (a scheduler without the hook): one context per prompt
            ctx = self._groups[group.prompt_id] = self._new_context(group)
        return ctx

    # --- persistence ---------------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the learned state (regressors, history) to ``path`` (.npz), atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"version": STATE_VERSION, "dim": DIM, "checkpoints": list(self.checkpoints), "observed": self.observed,
                "history_log": self._history_log,
                "openings": [[[list(key), stat] for key, stat in table.items()] for table in self._openings],
                "history": self.history.state()}
        for ci in range(len(self.checkpoints)):
            self._fold(ci)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, A=self._A, b=self._b, seen=np.array(self._seen, dtype=np.int64), yy=self._yy,
                 drift=self._drift, batch_x=self._batch_x, batch_y=self._batch_y, meta=np.array(json.dumps(meta)))
        tmp.replace(path)
        self._saved_at = self.observed

    def load(self, path: str | Path) -> None:
        """Warm-start from a state ``save`` wrote; a state of other checkpoints or features is refused."""
        path = Path(path)
        try:
            with np.load(path) as z:
                meta = json.loads(str(z["meta"]))
                A, b, seen, yy = z["A"], z["b"], z["seen"], z["yy"]
                drift, batch_x, batch_y = z["drift"], z["batch_x"], z["batch_y"]
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"predictor state {path}: cannot read it ({e}); delete it to start fresh") from None
        if meta.get("version") != STATE_VERSION or meta.get("dim") != DIM:
            raise ValueError(f"predictor state {path}: written by another version of the features "
                             f"(version {meta.get('version')}, dim {meta.get('dim')}); delete it to start fresh")
        if tuple(meta["checkpoints"]) != self.checkpoints:
            raise ValueError(f"predictor state {path}: learned at checkpoints {meta['checkpoints']}, this predictor "
                             f"uses {list(self.checkpoints)} (k={self.k}); use the same k or delete the file")
        self._A, self._b, self._seen, self._yy = A.copy(), b.copy(), [int(n) for n in seen], yy.copy()
        self._drift, self._batch_x, self._batch_y = drift.copy(), batch_x.copy(), batch_y.copy()
        self._rows = [[] for _ in self.checkpoints]
        self._reset_solutions()
        self.observed = self._saved_at = int(meta["observed"])
        self._history_log = {k: list(v) for k, v in meta["history_log"].items()}
        self._openings = [{tuple(key): list(stat) for key, stat in table} for table in meta["openings"]]
        self.history.load_state(meta["history"])


def parse_learned_spec(arg: str, max_len: int) -> LearnedPredictor:
    """``k=8,forget=0.99,min=32,q=0.8,state=PATH`` (any subset, any order) -> a ``LearnedPredictor``."""
    options: dict = {}
    names = {"k": ("k", int), "forget": ("forget", float), "min": ("min_samples", int), "q": ("quantile", float),
             "state": ("state_path", str)}
    for item in filter(None, (a.strip() for a in arg.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in names:
            raise ValueError(f"predictor 'learned:{arg}': cannot read {item!r}; expected KEY=VALUE with KEY one of "
                             "k, forget, min, q, state (e.g. learned:k=8,state=/tmp/lengths.npz)")
        option, kind = names[key]
        try:
            options[option] = kind(value)
        except ValueError:
            raise ValueError(f"predictor 'learned:{arg}': {key} needs a {kind.__name__}, got {value!r}") from None
    return LearnedPredictor(max_len, **options)

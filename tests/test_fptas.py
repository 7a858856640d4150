"""The global plan: the FPTAS keeps its (1+eps) promise against an exact solver, and never loses to LPT."""

import numpy as np
import pytest

from verl_infsample.core.fptas import (exact_makespan, fptas_schedule, lower_bound, lower_bound_with_arrivals,
                                      lpt_schedule)


def _check_schedule(lengths, sched, lanes):
    lengths = np.asarray(lengths, dtype=float)
    assert sched.lane.min() >= 0 and sched.lane.max() < lanes
    for lane in range(lanes):
        jobs = np.flatnonzero(sched.lane == lane)
        spans = sorted(zip(sched.start[jobs], sched.start[jobs] + lengths[jobs]))
        assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        load = lengths[jobs].sum()
        assert load <= sched.makespan + 1e-9
    assert sched.makespan == pytest.approx(max((sched.start + lengths).max(), 0.0))


@pytest.mark.parametrize("eps", [0.02, 0.1, 0.3])
def test_fptas_within_one_plus_eps_of_optimal(rng, eps):
    for _ in range(150):
        n, lanes = int(rng.integers(1, 11)), int(rng.integers(1, 5))
        lengths = rng.integers(1, 200, n)
        opt = exact_makespan(lengths, lanes)
        sched = fptas_schedule(lengths, lanes, eps)
        _check_schedule(lengths, sched, lanes)
        assert sched.makespan <= (1 + eps) * opt + 1e-9, (lengths, lanes, opt, sched)
        assert sched.makespan >= opt - 1e-9
        assert sched.eps_guaranteed <= eps + 1e-12  # the search completed: the guarantee is the one asked for


def test_fptas_beats_lpt_where_lpt_is_not_optimal():
    lengths = [3, 3, 2, 2, 2]  # LPT: 7, optimum: 6 (3+3 | 2+2+2)
    assert lpt_schedule(lengths, 2).makespan == 7
    assert exact_makespan(lengths, 2) == 6
    sched = fptas_schedule(lengths, 2, eps=0.1)
    assert sched.makespan == 6 and sched.method == "fptas"


def test_fptas_never_worse_than_lpt_on_paper_sized_groups(rng):
    for _ in range(30):
        lengths = np.minimum(1024, np.round(250 * np.exp(0.6 * rng.standard_normal() + 0.45 * rng.standard_normal(32))))
        f, l = fptas_schedule(lengths, 8, 0.02), lpt_schedule(lengths, 8)
        _check_schedule(lengths, f, 8)
        assert f.makespan <= l.makespan
        assert f.makespan <= (1 + f.eps_guaranteed) * lower_bound(lengths, 8) + 1e-9


def test_lower_bound_and_errors():
    assert lower_bound(np.array([10.0, 1.0, 1.0]), 2) == 10
    assert lower_bound(np.array([4.0, 4.0, 4.0]), 2) == 6
    with pytest.raises(ValueError, match="slots must be >= 1"):
        lpt_schedule([1, 2], 0)
    with pytest.raises(ValueError, match="fptas_eps"):
        fptas_schedule([1, 2], 2, eps=0)


def _list_schedule_with_arrivals(lengths, arrivals, lanes):
    """Unit steps, ``lanes`` rows a step, each job one unit a step from its arrival on, the longest remaining first:
    one feasible schedule, so never shorter than a lower bound."""
    remaining, t = np.array(lengths, dtype=int), 0
    while remaining.sum():
        ready = np.flatnonzero((np.asarray(arrivals) <= t) & (remaining > 0))
        remaining[ready[np.argsort(-remaining[ready])][:lanes]] -= 1
        t += 1
    return t


def test_the_bound_with_arrivals_holds_for_every_schedule_and_is_met_where_it_should_be(rng):
    assert lower_bound_with_arrivals([10, 1, 1], [0, 0, 0], 2) == lower_bound(np.array([10.0, 1.0, 1.0]), 2)
    assert lower_bound_with_arrivals([3, 3, 9], [0, 0, 5], 2) == 14  # the long job arrives late
    assert lower_bound_with_arrivals([4] * 6, [0, 0, 6, 6, 6, 6], 2) == 14  # a late burst: 6 + 16 / 2
    assert lower_bound_with_arrivals([], [], 4) == 0.0
    for _ in range(300):
        n, lanes = int(rng.integers(1, 12)), int(rng.integers(1, 4))
        lengths, arrivals = rng.integers(1, 9, n), rng.integers(0, 12, n)
        bound = lower_bound_with_arrivals(lengths, arrivals, lanes)
        assert bound >= lower_bound(lengths.astype(float), lanes) + arrivals.min() - 1e-9
        assert bound <= _list_schedule_with_arrivals(lengths, arrivals, lanes) + 1e-9
    with pytest.raises(ValueError, match="lanes must be >= 1"):
        lower_bound_with_arrivals([1], [0], 0)
    with pytest.raises(ValueError, match="one arrival per job"):
        lower_bound_with_arrivals([1, 2], [0], 1)


def _brute_force_makespan(lengths, lanes, release):
    """Every assignment of jobs to lanes (tiny instances): the reference for the exact solver with releases."""
    import itertools

    best = np.inf
    for assignment in itertools.product(range(lanes), repeat=len(lengths)):
        loads = np.array(release, dtype=float)
        np.add.at(loads, list(assignment), lengths)
        best = min(best, loads.max())
    return best


@pytest.mark.parametrize("eps", [0.02, 0.1])
def test_fptas_with_lane_releases_within_one_plus_eps_of_optimal(rng, eps):
    """A chunk planned after another starts on lanes that free at different times (P_M | a_i | C_max): the FPTAS
    keeps its bound against the exact solver, which itself matches brute force; starts respect the releases."""
    for trial in range(120):
        n, lanes = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        lengths = rng.integers(1, 100, n)
        release = rng.integers(0, 120, lanes).astype(float)
        opt = exact_makespan(lengths, lanes, release)
        if trial < 40:
            assert opt == _brute_force_makespan(lengths, lanes, release)
        assert opt >= lower_bound(lengths.astype(float), lanes, release) - 1e-9
        sched = fptas_schedule(lengths, lanes, eps, release=release)
        assert np.all(sched.start >= release[sched.lane] - 1e-9)
        for lane in range(lanes):  # each lane runs its jobs back to back from its release
            jobs = np.flatnonzero(sched.lane == lane)
            assert sched.start[jobs].min(initial=release[lane]) == pytest.approx(release[lane])
            assert release[lane] + lengths[jobs].sum() <= sched.makespan + 1e-9
        assert sched.makespan == pytest.approx(max(release.max(), (sched.start + lengths).max()))
        assert opt - 1e-9 <= sched.makespan <= (1 + eps) * opt + 1e-9, (lengths, release, opt, sched)
        assert sched.makespan <= lpt_schedule(lengths, lanes, release).makespan + 1e-9


def test_a_lane_whose_release_alone_is_the_highest_load_is_planned_around():
    """In the search's rounded units the most loaded lane can be a late lane with no job on it (its release alone):
    the local search leaves it be, and the plan keeps its bound."""
    lengths, release = np.array([82, 89, 20, 51, 95]), np.array([30.0, 167.0, 45.0, 59.0])
    sched = fptas_schedule(lengths, 4, 0.05, release=release)
    opt = exact_makespan(lengths, 4, release)
    assert opt - 1e-9 <= sched.makespan <= 1.05 * opt + 1e-9


def test_a_late_lane_gets_the_short_work():
    """Lanes free at 52 and 56 (the first chunk's samples still run): the next chunk's 101 tokens end together at
    105 = ceil((52 + 56 + 101) / 2); planned as if both lanes were free at once, at best at 106."""
    lengths = [16, 16, 16, 16, 16, 11, 8, 2]
    free = np.array([52.0, 56.0])
    sched = fptas_schedule(lengths, 2, 0.02, release=free)
    assert sched.makespan == 105 == exact_makespan(lengths, 2, free)
    blind = np.sort(np.bincount(fptas_schedule(lengths, 2, 0.02).lane, weights=lengths, minlength=2))[::-1]
    assert (np.sort(free) + blind).max() == 106  # its larger lane on the earlier free one: still past 105
    with pytest.raises(ValueError, match="release must be 2 non-negative times"):
        fptas_schedule(lengths, 2, 0.02, release=[1.0])


def _random_instance(rng):
    """Random sizes and shapes: few or many lanes, a few to many jobs per lane, ties, a fat tail, lanes that free
    at different times."""
    lanes = int(rng.choice([1, 2, 3, 7, 64, 256, 1024]))
    per_lane = float(rng.choice([0.3, 1.0, 1.5, 2.0, 3.0, 5.0]))
    n = int(rng.integers(0, max(2, int(lanes * per_lane)) + 1))
    shape = rng.integers(3)
    if shape == 0:  # lognormal, capped: the long tail of reasoning RL
        lengths = np.minimum(8192, np.round(np.exp(rng.normal(6.5, rng.uniform(0.2, 1.2), n))))
    elif shape == 1:  # many ties
        lengths = rng.choice([1.0, 50.0, 51.0, 400.0], n)
    else:
        lengths = rng.uniform(0, 1000, n)
    release = rng.integers(0, 3000, lanes).astype(float) if rng.random() < 0.4 else None
    return np.maximum(lengths, 0.0), lanes, release


@pytest.mark.parametrize("seed", range(6))
def test_fptas_property_valid_bounded_and_never_worse_than_lpt(seed):
    """Over random sizes (1 to 1024 lanes, up to 5 jobs per lane), shapes and seeds: the plan never raises, is a
    valid schedule, is no worse than LPT, and keeps the guarantee it reports."""
    rng = np.random.default_rng(1000 + seed)
    for _ in range(8):
        lengths, lanes, release = _random_instance(rng)
        eps = float(rng.choice([0.02, 0.05, 0.2]))
        sched = fptas_schedule(lengths, lanes, eps, release=release)
        assert len(sched.lane) == len(lengths) and (len(lengths) == 0 or 0 <= sched.lane.min() <= sched.lane.max() < lanes)
        loads = np.bincount(sched.lane, weights=lengths, minlength=lanes) + (0 if release is None else release)
        assert loads.max(initial=0.0) == pytest.approx(sched.makespan) or len(lengths) == 0
        assert sched.makespan <= lpt_schedule(lengths, lanes, release).makespan + 1e-6
        assert sched.makespan >= sched.lower_bound - 1e-6
        # a complete search keeps the asked-for bound against the optimum; a cut-off one reports its ratio to LB
        if sched.method == "fptas-budget":
            assert sched.makespan <= (1 + sched.eps_guaranteed) * sched.lower_bound + 1e-6
        else:
            assert sched.eps_guaranteed <= eps + 1e-12


def test_fptas_deep_search_over_many_big_jobs():
    """1280 jobs on 256 lanes, none small and LPT not certified: the search descends one job per level, deeper than
    any call stack holds, and still returns a bounded plan."""
    rng = np.random.default_rng(1)
    lengths = np.minimum(8192, np.maximum(1, np.round(np.exp(rng.normal(np.log(1500), 0.7, 1280)))))
    sched = fptas_schedule(lengths, 256, 0.02)
    assert sched.method.startswith("fptas")
    assert sched.makespan <= lpt_schedule(lengths, 256).makespan
    assert sched.eps_guaranteed < 0.05

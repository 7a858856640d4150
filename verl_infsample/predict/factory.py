"""Predictors by spec string (``noisy:0.3``, ``learned:k=8``): the core's and the learned one, in one registry."""

from __future__ import annotations

from typing import Callable

from ..core.predictor import (HistoryPredictor, LengthPredictor, NoInformationPredictor, NoisyOraclePredictor,
                              OraclePredictor)
from .learned import parse_learned_spec

PREDICTORS: dict[str, Callable[..., LengthPredictor]] = {
    "oracle": lambda arg, seed, max_len: OraclePredictor(),
    "noisy": lambda arg, seed, max_len: NoisyOraclePredictor(_float_arg("noisy", arg), seed, max_len),
    "none": lambda arg, seed, max_len: NoInformationPredictor(max_len),
    "history": lambda arg, seed, max_len: HistoryPredictor(max_len),
    "learned": lambda arg, seed, max_len: parse_learned_spec(arg, max_len),
}
_TAKE_ARGS = ("noisy", "learned")


def make_predictor(spec: str, *, seed: int = 0, max_len: int) -> LengthPredictor:
    """Build a predictor from its spec string, e.g. ``noisy:0.3``."""
    name, _, arg = spec.partition(":")
    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {spec!r}; choose one of: oracle, noisy:SIGMA, none, history, "
                         "learned[:k=K,forget=F,min=N,q=Q,state=PATH]")
    if arg and name not in _TAKE_ARGS:
        raise ValueError(f"predictor {name!r} takes no argument, got {spec!r}")
    return PREDICTORS[name](arg, seed, max_len)


def as_predictor(spec: str | LengthPredictor, *, seed: int = 0, max_len: int) -> LengthPredictor:
    """An instance as it is (e.g. one that learns across rollouts), a spec built by ``make_predictor``."""
    return make_predictor(spec, seed=seed, max_len=max_len) if isinstance(spec, str) else spec


def _float_arg(name: str, arg: str) -> float:
    try:
        return float(arg)
    except ValueError:
        raise ValueError(f"predictor '{name}:SIGMA' needs a number for SIGMA, got {arg!r} (e.g. {name}:0.3)") from None

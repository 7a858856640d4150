"""Decode engines behind one protocol (``base.Engine``): the transformers engine (torch, imported lazily), which
runs in a transformers server's rollout thread, and the step-exact simulator, which runs wherever it is called."""

from .base import Engine, run_rollout
from .simulated import SimulatedEngine, SimulationResult, simulate

__all__ = ["Engine", "SimulatedEngine", "SimulationResult", "run_rollout", "simulate"]

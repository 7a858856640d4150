"""Decode engines behind one protocol (``base.Engine``); heavy ones (transformers, vLLM) import lazily."""

from .base import Engine, run_rollout
from .simulated import SimulatedEngine, SimulationResult, simulate

__all__ = ["Engine", "SimulatedEngine", "SimulationResult", "run_rollout", "simulate"]

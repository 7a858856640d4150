"""The engine-agnostic core: samples, groups, capacity, plans, policies, predictors and the scheduler loop.

Pure Python + numpy: nothing here imports torch, Ray or verl. Where it runs: inside the transformers engine's rollout
thread (the scheduler, one call per decode step), in the simulator and the replay (the same calls, in process), and
on vLLM only through the server's request order (``integration.rollout.vllm``), on the server's event loop.
"""

from .capacity import KVBudget, PagedKVBudget, SlotPool
from .fptas import LaneSchedule, exact_makespan, fptas_schedule, lower_bound, lpt_schedule
from .policies import POLICIES, Policy, make_policy
from .predictor import LengthPredictor
from .sample import Group, Sample, SampleState
from .scheduler import Scheduler, SchedulerStats, build_scheduler
from .trace import TraceError, TracePrompt, read_trace, synth_trace, write_trace

__all__ = [
    "Group", "KVBudget", "LaneSchedule", "LengthPredictor", "POLICIES", "PagedKVBudget", "Policy",
    "Sample", "SampleState", "Scheduler", "SchedulerStats", "SlotPool", "TraceError", "TracePrompt", "build_scheduler",
    "exact_makespan", "fptas_schedule", "lower_bound", "lpt_schedule", "make_policy", "read_trace",
    "synth_trace", "write_trace",
]

"""The engine-agnostic core: samples, groups, capacity, plans, policies, predictors and the scheduler loop.

Pure Python + numpy: nothing here imports torch, Ray or verl.
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

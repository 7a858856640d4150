"""Drafts in the vLLM server (``custom.speculative``): what they may not change, and what they did.

With any ``speculative_config`` vLLM (0.24 and 0.32) raises on a request with ``min_p`` or ``logit_bias`` and refuses
custom logits processors at start: a request that asks for them is refused here first, by name and with the fix. What
drafts did comes from two places: vLLM's scheduler (drafted and accepted tokens, by position: ``stats``, the same
for every method) and, with ``group``, the drafter in the engine's drafting worker (its own time, where its drafts
came from, and the run-time law check of ``drafter.law_guard``), fetched through the ``worker_rpc`` the server hands
:class:`DraftReport` (its engine's ``collective_rpc``, calling ``worker_extension``).
"""

from __future__ import annotations

import logging
from ....drafter.law_guard import LawTally
from ...settings import PREFIX

logger = logging.getLogger(__name__)
CHANGED_BY_DRAFTS = {  # sampling parameter -> is it set (vLLM refuses it while drafts are on)
    "min_p": lambda v: v is not None and float(v) > 0,
    "logit_bias": lambda v: bool(v),
    "logits_processors": lambda v: bool(v),
}


def refuse_what_drafts_change(speculative: str, sampling_params: dict) -> None:
    if speculative == "off":
        return
    for key, is_set in CHANGED_BY_DRAFTS.items():
        if is_set(sampling_params.get(key)):
            raise ValueError(f"sampling parameter {key}={sampling_params[key]!r}: vLLM refuses it while drafts "
                             f"are on (actor_rollout_ref.rollout.custom.speculative={speculative!r}); remove it, or "
                             "set custom.speculative=off")


def say_what_drafts_cost(speculative: str) -> None:
    """vLLM (0.24 and 0.32) keeps async scheduling, the host's work on the next step overlapped with the GPU's on this
    one, only for drafters that run on the device (EAGLE/MTP, draft models, ``ngram_gpu``); with ``ngram``,
    ``suffix`` or a ``custom_class`` drafter every step pays the host's scheduling and drafting time on top of the
    GPU's, drafted or not. Said once, at start, rather than found from a slow run."""
    if speculative == "off":
        return
    logger.warning("rollout.name=infinite: %s.speculative=%s: vLLM schedules every step synchronously with this "
                   "drafter, so each step adds the host's scheduling and drafting time to the GPU's: drafts pay where "
                   "a replica's batch runs thin and cost time on a full one (README, Drafts: measure your host with "
                   "`infsample replay-host`)", PREFIX, speculative)


class LawMoved(RuntimeError):
    """Draft verification moved the sampled law, and ``custom.law_guard=fail`` asked to stop the run."""


class DraftReport:
    """The drafter's ``infsample/spec_*`` figures for verl's logger, and the law guard: the check accumulates over
    the run (a small gap becomes visible as tokens add up). It is read at every weight sync (``collect``: every
    trainer mode of verl syncs weights before a step) and when the ``infinite_sync`` trainer collects a step's
    figures (``pop_metrics``). On an alarm, ``law_guard`` says what happens: ``warn`` logs it, ``off_drafts`` logs it
    and stops the drafts for the rest of the run, ``fail`` stops the run (:class:`LawMoved`)."""

    def __init__(self, speculative: str, law_guard: str = "off_drafts"):
        self.speculative = speculative
        self.law_guard = law_guard
        self.law = LawTally()
        self.alarmed = False
        self.halted = False
        self._parts: list[dict] = []  # the workers' figures since the last pop_metrics

    async def collect(self, worker_rpc) -> None:
        """``worker_rpc(method)``: vLLM's ``collective_rpc`` of the server's engine. Takes the drafter's figures
        since the last call into the run's law check, and acts on an alarm."""
        if self.speculative != "group":
            return
        parts = [p for p in await worker_rpc("infsample_pop_drafter_stats") if p]
        for p in parts:
            self.law.merge(LawTally(**p["law"]))
        self._parts += parts
        if self.law.alarm and not self.alarmed:
            self.alarmed = True
            await self._alarm(worker_rpc)

    async def pop_metrics(self, worker_rpc) -> dict:
        """The figures since the last call (after a :meth:`collect`)."""
        await self.collect(worker_rpc)
        parts, self._parts = self._parts, []
        if not parts:
            return {"infsample/spec_drafts_halted": float(self.halted)} if self.speculative == "group" else {}
        steps = max(p["steps"] for p in parts)
        propose_s = max(p["propose_s"] for p in parts)
        step_law = LawTally()
        for p in parts:
            step_law.merge(LawTally(**p["law"]))
        return {"infsample/spec_drafter_ms_per_step": 1e3 * propose_s / max(1, steps),
                "infsample/spec_proposing_rows": sum(p["proposing_rows"] for p in parts),
                "infsample/spec_rows": sum(p["rows"] for p in parts),
                "infsample/spec_from_group": sum(p["from_group"] for p in parts),
                "infsample/spec_group_tree_mb": sum(p["group_bytes"] for p in parts) / 2**20,  # an engine reports once
                "infsample/spec_tree_mb": sum(p["tree_bytes"] for p in parts) / 2**20,
                "infsample/spec_law_gap": step_law.gap, "infsample/spec_law_z": self.law.z,
                "infsample/spec_law_tested": self.law.tested, "infsample/spec_law_alarm": float(self.law.alarm),
                "infsample/spec_drafts_halted": float(self.halted)}

    async def _alarm(self, worker_rpc) -> None:
        what = (f"draft verification moves the sampled law: {self.law.accepted} of {self.law.tested} tested draft "
                f"tokens accepted, {self.law.expected:.1f} expected from their target probabilities (z="
                f"{self.law.z:.1f}). The rejection sampler is not verifying with the requests' own parameters; "
                "report the vLLM build")
        if self.law_guard == "fail":
            raise LawMoved(f"rollout.name=infinite: {what}; the run stops ({PREFIX}.law_guard=fail; "
                           f"{PREFIX}.speculative=off runs without drafts)")
        if self.law_guard == "off_drafts":
            await worker_rpc("infsample_halt_drafter")
            self.halted = True
            logger.error("rollout.name=infinite: %s. Drafts are off for the rest of the run (%s.law_guard="
                         "off_drafts)", what, PREFIX)
        else:
            logger.error("rollout.name=infinite: %s. Drafts stay on (%s.law_guard=warn): turn them off with "
                         "%s.speculative=off", what, PREFIX, PREFIX)

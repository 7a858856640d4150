"""verl's colocated weight-sync socket, named per Ray cluster rather than per Ray job id.

verl names it ``/tmp/rl-colocate-zmq-{job_id}-replica-{r}-rank-{k}.sock``. The first driver of a fresh Ray cluster
always gets job id ``01000000``, so two verl runs on one host, each with its own local Ray cluster (as the test
suite's parallel trainer runs are), name the same socket: the later sender unlinks and rebinds it, the earlier run's
vLLM worker talks to the wrong trainer, and both wait forever. The raylet's pid tells the clusters apart: every Ray
worker has it in ``RAY_RAYLET_PID``, and the processes vLLM starts inherit it from its server, a Ray actor.
"""

from __future__ import annotations

import os

SOCKET_PREFIX = "rl-colocate-zmq-"


def scoped_to_raylet(handle: str, environ=None) -> str:
    """``handle`` with this node's raylet pid after verl's prefix; unchanged outside Ray (both ends agree)."""
    raylet = (os.environ if environ is None else environ).get("RAY_RAYLET_PID", "")
    if not raylet or SOCKET_PREFIX not in handle:
        return handle
    return handle.replace(SOCKET_PREFIX, f"{SOCKET_PREFIX}raylet{raylet}-", 1)

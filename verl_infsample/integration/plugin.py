"""Loaded by ``import verl`` through the ``verl.plugins`` entry point, in every process (Ray workers included).

verl only imports this module (it never calls anything in it), so registration happens here, on import.
CPU runs opt in with ``VERL_INFSAMPLE_CPU=1`` (or ``VERL_PLATFORM=cpu``): the CPU platform and its patches go in
first, before anything asks verl for its platform. Without the opt-in nothing of the CPU mode runs.
"""

from .. import register
from .cpu import activate, opted_in

if opted_in():
    activate()

register()

"""Loaded by ``import verl`` through the ``verl.plugins`` entry point, in every process (Ray workers included).

verl only imports this module (it never calls anything in it), so registration happens here, on import.
"""

from . import register

register()

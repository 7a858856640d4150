"""Shared-memory segments a CPU run leaves in /dev/shm, and their removal.

Ray ends vLLM's CPU executor, its message queues and verl's weight-transfer buffers without their cleanup, which
leaves Python shared-memory segments (``psm_*``, hundreds of MB each) and multiprocessing semaphores in /dev/shm.
A run snapshots /dev/shm first and, once it has ended, removes the segments that appeared since and that no live
process still maps or holds open (so a concurrent run keeps its own):

    python -m verl_infsample.verl_cpu.shm snapshot FILE   # before
    python -m verl_infsample.verl_cpu.shm clean FILE      # after; prints what it removed
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

SHM = Path("/dev/shm")
LEFT_BEHIND = ("psm_", "sem.mp-")


def listing() -> set[str]:
    return set(os.listdir(SHM)) if SHM.is_dir() else set()


def in_use() -> set[str]:
    """Names under /dev/shm that a live process maps or holds open (as far as /proc lets this user see)."""
    used: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.split("/dev/shm/", 1)[1].split(" ", 1)[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/"):].split(" ", 1)[0])
        except OSError:
            continue
    return used


def remove_left_behind(before: set[str], wait_s: float = 0.0) -> list[str]:
    """Remove the ``psm_*`` / ``sem.mp-*`` entries that are new since ``before`` and that nothing uses, waiting up
    to ``wait_s`` for the processes that still use some to end (Ray ends a run's workers after its driver)."""
    new = sorted(n for n in listing() - before if n.startswith(LEFT_BEHIND))
    if not new:
        return []
    deadline = time.monotonic() + wait_s
    while (used := in_use() & set(new)) and time.monotonic() < deadline:
        time.sleep(0.5)
    removed = []
    for name in new:
        if name in used:
            continue
        try:
            (SHM / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "clean"):
        print(__doc__, file=sys.stderr)
        return 2
    command, path = argv
    if command == "snapshot":
        Path(path).write_text("\n".join(sorted(listing())))
        return 0
    before = set(Path(path).read_text().split()) if Path(path).exists() else listing()
    removed = remove_left_behind(before, wait_s=15.0)
    if removed:
        print(f"removed {len(removed)} shared-memory segment(s) left in /dev/shm: {' '.join(removed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

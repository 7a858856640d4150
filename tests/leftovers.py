"""What a CPU run leaves behind once Ray has ended it, and its removal.

Ray ends vLLM's CPU executor, its message queues and verl's weight-transfer buffers without their cleanup, which
leaves Python shared-memory segments (``psm_*``, hundreds of MB each) and multiprocessing semaphores in /dev/shm, and
vLLM's ZeroMQ IPC sockets (``<tmp>/<uuid>``) and torch.distributed rendezvous files (``<tmp>/vllm_dist_<hex>``) in
the temporary folder (``$TMPDIR``, else /tmp). A run snapshots both first and, once it has ended, removes
what appeared since and no live process still uses (a segment nobody maps or holds open, a socket nobody has
bound), so a concurrent run keeps its own. The tests' run does (``conftest``), and so do the CPU examples
(``examples/cpu_env.sh``):

    python tests/leftovers.py snapshot FILE   # before
    python tests/leftovers.py clean FILE      # after; prints what it removed
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path

SHM = Path("/dev/shm")
TMP = Path(tempfile.gettempdir())  # where vLLM puts its sockets and rendezvous files ($TMPDIR, else /tmp)
LEFT_BEHIND = ("psm_", "sem.mp-")
IPC_SOCKET = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # vLLM's ipc:///tmp/<uuid4>
DIST_FILE = re.compile(r"vllm_dist_[0-9a-f]{32}")  # vLLM's file:///tmp/vllm_dist_<uuid4 hex> init method


def listing() -> set[str]:
    """Entries of /dev/shm by name, and vLLM's IPC sockets and rendezvous files of the temporary folder as
    ``<tmp>/<name>``."""
    names = set(os.listdir(SHM)) if SHM.is_dir() else set()
    try:
        names |= {f"{TMP}/{n}" for n in os.listdir(TMP) if IPC_SOCKET.fullmatch(n) or DIST_FILE.fullmatch(n)}
    except OSError:
        pass
    return names


def in_use() -> set[str]:
    """Names under /dev/shm that a live process maps or holds open, files of the temporary folder held open, and
    bound unix socket paths (as far as /proc lets this user see). A mapping is matched by its inode too: glibc's
    ``sem_open`` maps a semaphore under a temporary name and then links it to its own (``sem.mp-*``: a live
    multiprocessing lock), so /proc shows the name it no longer has."""
    used: set[str] = set()
    inodes: set[int] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.split("/dev/shm/", 1)[1].split(" ", 1)[0])
                    fields = line.split()
                    if len(fields) > 4 and fields[4].isdigit():
                        inodes.add(int(fields[4]))
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/"):].split(" ", 1)[0])
                elif target.startswith(f"{TMP}/"):
                    used.add(target)
        except OSError:
            continue
    if inodes and SHM.is_dir():
        for entry in os.scandir(SHM):
            try:
                if entry.inode() in inodes:
                    used.add(entry.name)
            except OSError:
                continue
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith("/"):
                used.add(parts[7])
    except OSError:
        pass
    return used


def _removable(name: str) -> bool:
    if name.startswith("/"):
        try:
            mode = os.lstat(name).st_mode
        except OSError:
            return False
        return stat.S_ISSOCK(mode) or (stat.S_ISREG(mode) and DIST_FILE.fullmatch(os.path.basename(name)) is not None)
    return name.startswith(LEFT_BEHIND)


def remove_left_behind(before: set[str], wait_s: float = 0.0) -> list[str]:
    """Remove the segments, semaphores and vLLM sockets and files that are new since ``before`` and that nothing
    uses, waiting up to ``wait_s`` for the processes that still use some to end (Ray ends a run's workers after its
    driver)."""
    new = sorted(n for n in listing() - before if _removable(n))
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
            (Path(name) if name.startswith("/") else SHM / name).unlink()
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
        shown = " ".join(removed[:4]) + (" ..." if len(removed) > 4 else "")
        print(f"removed {len(removed)} shared-memory segment(s), socket(s) and file(s) the run left behind: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

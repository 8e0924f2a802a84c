"""What this process holds, for the measurement scripts (soak.py, many_comms.py): its
resident memory, and the node-shared memory it maps from /dev/shm -- its own mappings,
unlinked files included, so that other jobs on the node do not move the figure."""
from __future__ import annotations

import os
import shutil


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def shm_used() -> int:
    """Space used in /dev/shm by every process of the node (0 where there is none)."""
    try:
        return shutil.disk_usage("/dev/shm").used
    except OSError:
        return 0


def shm_mapped() -> tuple:
    """(mappings of /dev/shm files, their resident bytes) in this process."""
    count = resident = 0
    inside = False
    try:
        f = open("/proc/self/smaps")
    except OSError:            # not Linux
        return 0, 0
    with f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:    # a mapping's header
                inside = len(head) == 6 and head[5].startswith("/dev/shm/")
                count += inside
            elif inside and line.startswith("Rss:"):
                resident += int(line.split()[1]) * 1024
    return count, resident

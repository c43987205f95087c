"""Resident memory of this process, as the benchmarks measure it: its peak so far and its size now (the CPU
allocator keeps no peak counter, so a benchmark runs a call in a fresh process). Linux only.
"""

from __future__ import annotations

import resource

MIB = 2**20


def peak_rss_bytes() -> int:
    """The largest resident set this process has had since it started (``VmHWM`` of ``/proc/self/status``), in
    bytes. Not ``ru_maxrss``: Linux carries that over an exec, so a child started by a larger process reads its
    parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """This process's resident set now (``/proc/self/statm``), in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_mib() -> float:
    return peak_rss_bytes() / MIB


def current_rss_mib() -> float:
    return current_rss_bytes() / MIB

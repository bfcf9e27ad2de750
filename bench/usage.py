"""Memory and CPU of a job's processes, read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def memory_bytes(pid: int) -> int:
    """The process's proportional set size: its resident pages, each shared page divided among the processes
    that map it (resident sizes summed over processes count shared pages once per process)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # no smaps_rollup (older kernels): the resident size
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0  # gone meanwhile


def processes() -> dict[int, list[str]]:
    """Each process's fields of /proc/PID/stat after its command: state, ppid, pgrp, ..."""
    fields = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields[int(entry)] = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
    return fields


def cpu_seconds(stat: list[str]) -> float:
    """User and system CPU time of a process so far, from its /proc/PID/stat fields."""
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def tree(root: int) -> dict[int, list[str]]:
    """``root`` and all its descendants, with their /proc/PID/stat fields (as :func:`processes`)."""
    every = processes()
    children: dict[int, list[int]] = {}
    for pid, stat in every.items():
        children.setdefault(int(stat[1]), []).append(pid)
    found, pending = {}, [root]
    while pending:
        pid = pending.pop()
        if pid in every:
            found[pid] = every[pid]
        pending.extend(children.get(pid, []))
    return found


def tree_memory_bytes(root: int) -> int:
    """Memory of ``root`` and all its descendants (:func:`total_memory_bytes`)."""
    return total_memory_bytes(tree(root))


def total_memory_bytes(group: dict[int, list[str]]) -> int:
    """The sum of the processes' proportional set sizes, leaving out a child that still runs its parent's program.
    A JVM spawns commands (Hadoop's shell calls) with a child that shares the JVM's memory until its exec
    (``posix_spawn``: ``CLONE_VM``); its proportional size is the JVM's whole, counted twice. A child forked
    without sharing its parent's memory only holds copies of its pages until the exec."""
    return sum(memory_bytes(pid) for pid, stat in group.items() if not _runs_its_parents_program(pid, int(stat[1])))


def _runs_its_parents_program(pid: int, parent: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == os.readlink(f"/proc/{parent}/exe")
    except OSError:
        return False  # gone, or the parent is not ours to read


def tree_cpu_seconds(root: int) -> float:
    """User and system CPU time of ``root`` and all its descendants so far."""
    return sum(map(cpu_seconds, tree(root).values()))

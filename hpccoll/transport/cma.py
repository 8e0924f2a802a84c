"""Single-copy reads and writes of another process's memory on the same node: Linux
Cross Memory Attach (``process_vm_readv``, ``process_vm_writev``), as MPICH and Open MPI
move large messages between ranks.

A peer's ordinary NumPy buffer is read where it lies, in the peer's process, straight
into this rank's buffer: one copy, made by the kernel, where staging through node-shared
memory makes two (algorithms/cma.py).  The kernel allows it where this process may
ptrace the peer: same user, and under Yama's ptrace_scope 1 (Ubuntu's default) only a
process's ancestors, or whom it named, while an MPI job's ranks are siblings; so each
rank names any process (``allow_peers``: prctl PR_SET_PTRACER_ANY, as Open MPI does for
its own single copy; the user checks still apply).  Containers often forbid it anyway
(seccomp, separate PID namespaces), and Yama 2 or 3 does.  ``create`` in
transport/shm.py therefore probes it between every pair of a node's ranks when a
communicator's shared memory is set up, and the single-copy candidates run only where
every rank could read every peer (``ShmArea.cma``).

The kernel checks a write as it checks a read (the caller may ptrace the peer), but a
seccomp filter may name the two calls apart, so the probe tries both.

The C executor (engine/_native.c) makes the same system calls itself; ``read`` and
``write`` here serve the Python executor and the probe.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc():
    """Linux's C library (None elsewhere, or where it has no process_vm_readv)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fns = (libc.process_vm_readv, libc.process_vm_writev)
    except (OSError, AttributeError):
        return None
    for fn in fns:
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                       ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    return libc


_LIBC = _libc()
_readv = _LIBC.process_vm_readv if _LIBC is not None else None
_writev = _LIBC.process_vm_writev if _LIBC is not None else None
PR_SET_PTRACER = 0x59616D61            # linux/prctl.h (Yama)
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
_allowed = False


def allow_peers() -> None:
    """Let the job's other ranks read this process where Yama's ptrace_scope 1 would
    refuse siblings (once per process; where Yama is absent prctl says EINVAL: nothing
    to do, and nothing is lost where it fails)."""
    global _allowed
    if _allowed or _LIBC is None:
        return
    _allowed = True
    _LIBC.prctl(ctypes.c_int(PR_SET_PTRACER), ctypes.c_ulong(PR_SET_PTRACER_ANY),
                ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


# what every rank offers its peers to read at the probe (kept alive for the process)
_TOKEN = ctypes.create_string_buffer(b"hpccoll cross-memory probe", 32)


def token() -> tuple:
    """(pid, address) of this process's probe bytes, for the peers' ``probe``."""
    return os.getpid(), ctypes.addressof(_TOKEN)


def _move(call, name: str, pid: int, here: int, there: int, nbytes: int) -> None:
    """``nbytes`` between address ``here`` of this process and ``there`` of process
    ``pid``, by ``call`` (process_vm_readv: there to here; _writev: here to there)."""
    if call is None:
        raise OSError(f"{name} is not available here")
    done = 0
    while done < nbytes:     # the kernel may stop short (a page boundary): go on from there
        local = _IoVec(here + done, nbytes - done)
        remote = _IoVec(there + done, nbytes - done)
        got = call(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{name} with process {pid}: {os.strerror(err)}")
        done += got


def read(pid: int, dst: int, src: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``src`` of process ``pid`` to address ``dst`` here;
    OSError where the kernel refuses (the whole transfer or nothing is the caller's)."""
    _move(_readv, "process_vm_readv", pid, dst, src, nbytes)


def write(pid: int, dst: int, src: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``src`` here to address ``dst`` of process ``pid``;
    OSError where the kernel refuses."""
    _move(_writev, "process_vm_writev", pid, src, dst, nbytes)


def probe(pid: int, address: int) -> bool:
    """Whether this process may read the probe bytes process ``pid`` offered (``token``),
    and write them (the same bytes back: its peers may probe them at the same time)."""
    buf = ctypes.create_string_buffer(len(_TOKEN))
    try:
        read(pid, ctypes.addressof(buf), address, len(_TOKEN))
        if buf.raw != _TOKEN.raw:
            return False
        write(pid, address, ctypes.addressof(buf), len(_TOKEN))
    except OSError:
        return False
    return True

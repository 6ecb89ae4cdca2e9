"""seccomp through libseccomp: refuse system calls a candidate never needs.

libseccomp is the maintained library behind every seccomp user (systemd, container runtimes); its
stable C API (``seccomp_init``, ``seccomp_rule_add_array``, ``seccomp_load``) is called here through
ctypes, the same way its own Python bindings do. The filter is installed in the worker before
candidate code is loaded and is inherited by every thread. Denied calls fail with EPERM (the
candidate sees an ordinary error, and the verdict records it), except ``clone3``, which answers
ENOSYS so that the C library falls back to ``clone``, whose flags a filter can inspect.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import socket

_ACT_ALLOW = 0x7FFF0000
_CMP_NE, _CMP_MASKED_EQ = 1, 7
_CLONE_THREAD = 0x00010000

#: Always refused: debugging other processes, kernel interfaces, name spaces, mounts, device nodes
#: (a block device node made by a root worker would read the disk).
ALWAYS_DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "keyctl",
                 "add_key", "request_key", "mount", "umount2", "unshare", "setns", "pivot_root", "chroot",
                 "kexec_load", "init_module", "finit_module", "delete_module", "userfaultfd", "io_uring_setup",
                 "mknod", "mknodat")
#: Refused when the process may not start processes (the interpreter worker): every way to fork
#: or exec. Threads (``clone`` with CLONE_THREAD) stay allowed: torch's thread pools need them.
PROCESS_CALLS = ("fork", "vfork", "execve", "execveat")


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _library() -> ctypes.CDLL | None:
    # The soname first: find_library runs ldconfig or a compiler, which a sandbox may not allow.
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        found = ctypes.util.find_library("seccomp")
        if not found:
            return None
        try:
            lib = ctypes.CDLL(found, use_errno=True)
        except OSError:
            return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def available() -> bool:
    """Whether libseccomp can be loaded on this machine."""
    return _library() is not None


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def install(*, allow_processes: bool, allow_inet: bool = False) -> None:
    """Install the filter in this process. ``allow_processes``: fork/exec stay possible (the
    compile path runs Triton's ptxas; Landlock then limits what may be executed). ``allow_inet``:
    sockets other than AF_UNIX stay possible (never, for candidate code).

    Raises OSError when libseccomp is missing or the kernel refuses the filter.
    """
    lib = _library()
    if lib is None:
        raise OSError("libseccomp is not installed")
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        def deny(name: str, *conditions: _ArgCmp, code: int = errno.EPERM) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return  # not a call of this architecture
            array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
            rc = lib.seccomp_rule_add_array(ctx, _errno_action(code), number, len(conditions), array)
            if rc < 0:
                raise OSError(-rc, f"seccomp_rule_add {name}: {rc}")

        for name in ALWAYS_DENIED:
            deny(name)
        if not allow_inet:
            deny("socket", _ArgCmp(0, _CMP_NE, socket.AF_UNIX, 0))
            deny("socketpair", _ArgCmp(0, _CMP_NE, socket.AF_UNIX, 0))
        if not allow_processes:
            for name in PROCESS_CALLS:
                deny(name)
            deny("clone", _ArgCmp(0, _CMP_MASKED_EQ, _CLONE_THREAD, 0))
            deny("clone3", code=errno.ENOSYS)
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {rc}")
    finally:
        lib.seccomp_release(ctx)

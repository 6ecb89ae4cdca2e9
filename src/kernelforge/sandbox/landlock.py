"""Landlock (Linux 5.13+): confine a process's file system, execution and network access.

Landlock is an unprivileged Linux security module: a process restricts itself, irrevocably, and
every thread and child it makes inherits the restriction. It has no C library wrapper; its three
system calls are made here through ctypes with the kernel's documented structures
(``linux/landlock.h``). What a kernel supports is negotiated by ABI version: file system rules
since ABI 1, ``TRUNCATE`` since 3, TCP bind/connect since 4, device ioctls since 5, and scoping of
abstract UNIX sockets and signals since 6. Rights a kernel does not know are dropped, and the ABI
used is recorded with each result's environment.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass
from typing import Sequence

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_PR_SET_NO_NEW_PRIVS = 38
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13
TRUNCATE = 1 << 14
IOCTL_DEV = 1 << 15

READ = READ_FILE | READ_DIR
WRITE = (WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO
         | MAKE_BLOCK | MAKE_SYM | REFER | TRUNCATE)

#: File system rights each ABI knows (rights of a later ABI are dropped on an earlier kernel).
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Rule:
    """``access`` (a bitwise or of the rights above) to everything beneath ``path``."""

    path: str
    access: int


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The Landlock ABI of the running kernel; 0 when Landlock is unavailable or disabled."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(numbers[0]), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _fs_rights(abi: int) -> int:
    return _FS_BY_ABI[max(k for k in _FS_BY_ABI if k <= abi)]


def restrict(rules: list[Rule], *, handled: int, deny_tcp: bool = True, scope: bool = True) -> int:
    """Restrict this process (and every thread and child it later makes) to ``rules``: of the
    rights in ``handled``, only what a rule grants beneath its path is allowed. ``deny_tcp``
    forbids every TCP bind and connect (ABI 4+); ``scope`` forbids connecting to abstract UNIX
    sockets and signalling processes outside this sandbox (ABI 6+).

    Returns the ABI used. Raises OSError when the kernel refuses; paths that do not exist are
    skipped (a rule for an absent folder grants nothing anyway).
    """
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    create, add_rule, restrict_self = _SYSCALLS[platform.machine()]
    known = _fs_rights(abi)
    attr = _RulesetAttr(handled & known, (_NET_BIND_TCP | _NET_CONNECT_TCP) if deny_tcp and abi >= 4 else 0,
                        (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if scope and abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(ctypes.c_long(create), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for rule in rules:
            try:
                fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                access = rule.access & handled & known
                if not os.path.isdir(rule.path):
                    access &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # rights of a file
                beneath = _PathBeneathAttr(access, fd)
                if access and libc.syscall(ctypes.c_long(add_rule), ctypes.c_int(ruleset),
                                           ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(beneath),
                                           ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {rule.path}: "
                                                      f"{os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(ctypes.c_long(restrict_self), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return abi


# -- the rules of a sandboxed kernelforge process ------------------------------------------------

#: Every right a sandboxed process's rules decide (anything else Landlock knows stays as it was).
HANDLED = READ | WRITE | EXECUTE | IOCTL_DEV
#: What a sandboxed process may do in the folders it writes: everything but making device nodes
#: (as root, a block device node made in its own folder would read the disk).
WRITE_FILES = WRITE & ~(MAKE_CHAR | MAKE_BLOCK)

#: Folders of the system, read-only: programs, shared libraries (the CUDA driver's among them on
#: most hosts), locale and time zone data. Nothing in them is executable unless a rule says so.
SYSTEM_FOLDERS = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin")
#: The few files of ``/etc`` the C library and Python read (never all of ``/etc``: it holds host
#: keys and credentials): the dynamic loader's cache (a library loaded later, ptxas's libraries),
#: local time, and the user and group names.
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/nsswitch.conf",
             "/etc/passwd", "/etc/group")
#: Device files any process may read (torch seeds from them).
DEVICE_FILES = ("/dev/urandom", "/dev/random", "/dev/zero")
#: Kernel interfaces, read-only: the process's own memory map and status (allocators, the fault
#: handler, NVIDIA's driver), the machine's processors and memory (thread pools size themselves
#: from them), and ``/sys`` (processor topology; the GPU's PCI and NUMA facts the driver reads).
#: ``/proc/self/environ`` is the exec environment, which every sandboxed process gets from the
#: allowlist (it holds nothing else). The rest of ``/proc`` (other processes, the search's
#: command line and environment) stays out of reach.
KERNEL_FILES = ("/proc/self/maps", "/proc/self/status", "/proc/self/stat", "/proc/self/statm", "/proc/self/cgroup",
                "/proc/self/environ", "/proc/self/mountinfo", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/sys")
#: What NVIDIA's driver opens on a GPU host (none of it exists elsewhere): its control and GPU
#: device files (read, write and ioctl), its capability files, its ``/proc`` facts, and ``/dev/shm``
#: (torch's CUDA IPC keeps the reference count of a shared tensor in a file there, see
#: :mod:`kernelforge.execute.worker.cuda_share`; the driver's own shared memory). NOT TESTED on a GPU host by the
#: tests of this project (no GPU where they run); a missing entry shows as a worker that cannot
#: start or a CUDA error naming the file, and ``KERNELFORGE_SANDBOX=off`` turns the sandbox off.
GPU_DEVICE_GLOB = "/dev/nvidia*"
GPU_FOLDERS = ("/dev/nvidia-caps", "/proc/driver/nvidia", "/dev/shm")


def elf_interpreter(path: str) -> str | None:
    """The ELF interpreter (``PT_INTERP``: the dynamic loader) a 64-bit little-endian program names,
    or None (a static program, a script, not a file)."""
    import struct

    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", header, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                p_type, _, offset, _, _, size = struct.unpack("<IIQQQQ", f.read(40))
                if p_type == 3:  # PT_INTERP
                    f.seek(offset)
                    return f.read(size).rstrip(b"\0").decode() or None
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _files(root: str) -> list[str]:
    if os.path.isdir(root):
        return [os.path.join(root, name) for name in sorted(os.listdir(root))]
    return [root]


def process_rules(temp_dir: str, read_roots: Sequence[str], execute_roots: Sequence[str], gpu: bool) -> list[Rule]:
    """The rules of a sandboxed process: read the system (:data:`SYSTEM_FOLDERS`,
    :data:`ETC_FILES`, :data:`DEVICE_FILES`, :data:`KERNEL_FILES`) and ``read_roots`` (the Python
    installation, ``sys.path``, the kernels folders); read and execute beneath ``execute_roots``
    (Triton's ptxas; empty: nothing may be executed); read and write only ``temp_dir`` and
    ``/dev/null``; with ``gpu``, what NVIDIA's driver needs (:data:`GPU_DEVICE_GLOB`,
    :data:`GPU_FOLDERS`). Everything else (the home folder, the rest of ``/etc``, other users'
    temporary files, the search's database) is out of reach."""
    import glob

    reads = (*SYSTEM_FOLDERS, *ETC_FILES, *DEVICE_FILES, *KERNEL_FILES, *read_roots)
    rules = [Rule(path, READ) for path in reads]
    # A dynamically linked program is started through its ELF interpreter (the dynamic loader),
    # which must be executable too. The loader can start any readable program itself
    # (``ld.so PROGRAM``), and Landlock does not see a program run from memory (a memfd): what
    # runs either way inherits this whole sandbox (no network, no writes outside temp_dir, no
    # reads outside these rules, seccomp's filter), so it can do no more than the process itself.
    loaders = sorted({loader for root in execute_roots for loader in map(elf_interpreter, _files(root)) if loader})
    rules += [Rule(path, READ | EXECUTE) for path in (*execute_roots, *loaders)]
    rules += [Rule(temp_dir, READ | WRITE_FILES), Rule("/dev/null", READ_FILE | WRITE_FILE)]
    if gpu:
        rules += [Rule(path, READ_FILE | WRITE_FILE | IOCTL_DEV) for path in sorted(glob.glob(GPU_DEVICE_GLOB))]
        rules += [Rule(path, READ | WRITE_FILES | IOCTL_DEV) for path in GPU_FOLDERS]
    return rules

"""The sandbox's syscall profile: a default-deny allow-list, built with libseccomp, loaded before any student code.

Every process of a sandbox runs under it: a system call that is not on the list fails with ``EPERM`` (``clone3``
with ``ENOSYS``, on which the C library falls back to ``clone``, whose namespace flags a filter can read), and a
call made through another ABI (x32 or i386 on x86-64, arm32 on aarch64) fails with ``EPERM`` too. The list is in
the spirit of Docker's default profile (moby's ``profiles/seccomp/default.json`` for a container without added
capabilities), and narrower where a notebook has no use for a call: what :data:`DENIED` names is never allowed:
the kernel keyring (it is not namespaced: a key one sandbox added, another sandbox or account could read),
``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring``, tracing another process (``ptrace``,
``process_vm_readv``, ``pidfd_getfd``, ``kcmp``), mounting, new namespaces (``unshare``, ``setns``, ``clone``
with a namespace flag), ``kexec``, ``reboot``, modules, swap, the clock, accounting, ...

How it is built and loaded
    The trusted grading process builds the profile with libseccomp (the system's ``libseccomp2``, through the
    ``pyseccomp`` ctypes binding) and exports it as a classic BPF program (``seccomp_export_bpf``):
    :func:`program`. The sandbox's launcher receives those bytes on its command line and loads them with
    ``prctl(PR_SET_SECCOMP)`` right after ``PR_SET_NO_NEW_PRIVS``, before it execs anything (:data:`LOADER`): the
    student's side never needs the binding, and a filter is inherited by every child and across exec and cannot
    be removed. Fail closed: a profile that cannot be built stops grading with :class:`ProfileUnavailable`
    (nothing starts), and a program the kernel refuses stops the launcher before the notebook's first line.

Two profiles (``kind``)
    ``kernel``: every process of a notebook (a cold sandbox's launcher loads it once it has dropped to the sandbox
    uid). ``zygote``: a warm sandbox's root zygote, which forks each notebook's kernel: the same list, plus
    ``unshare`` with exactly ``CLONE_NEWIPC``. Its forked child, still root, unshares a fresh IPC namespace (SysV
    shared memory, semaphores, message queues and POSIX message queues of that notebook alone, gone with its last
    process), drops to the sandbox uid, then loads the ``kernel`` profile on top (filters stack: the strictest
    verdict wins, so from there on ``unshare`` is refused too) before it imports the kernel. The zygote itself
    runs no student code.
"""

from __future__ import annotations

import errno
import functools
import platform
import tempfile

MACHINES = {"x86_64": "X86_64", "aarch64": "AARCH64"}  # machine -> pyseccomp's Arch name
KINDS = ("kernel", "zygote")
BPF_MAX_INSTRUCTIONS = 4096  # the kernel's BPF_MAXINSNS: a longer program is refused
CLONE_NEWIPC = 0x08000000
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
AF_VSOCK = 40
# personality(2) values a program may set (Docker's): PER_LINUX, PER_LINUX32, UNAME26, both, and a query (~0)
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

# Allowed whatever the arguments. Names a machine lacks (open on aarch64, the *32/time64 variants on x86-64) are
# skipped there by libseccomp; names this libseccomp does not know are skipped: such calls stay denied.
ALLOWED = (
    # files and folders
    "access", "faccessat", "faccessat2", "chdir", "fchdir", "getcwd", "chmod", "fchmod", "fchmodat", "chown",
    "chown32", "fchown", "fchown32", "fchownat", "lchown", "lchown32", "open", "openat", "openat2", "creat",
    "close", "close_range", "read", "readv", "pread64", "preadv", "preadv2", "write", "writev", "pwrite64",
    "pwritev", "pwritev2", "lseek", "_llseek", "stat", "stat64", "fstat", "fstat64", "lstat", "lstat64",
    "newfstatat", "fstatat64", "statx", "statfs", "statfs64", "fstatfs", "fstatfs64", "truncate", "truncate64",
    "ftruncate", "ftruncate64", "fallocate", "fadvise64", "fadvise64_64", "readahead", "fsync", "fdatasync",
    "sync", "syncfs", "sync_file_range", "mkdir", "mkdirat", "rmdir", "rename", "renameat", "renameat2", "link",
    "linkat", "symlink", "symlinkat", "unlink", "unlinkat", "readlink", "readlinkat", "getdents", "getdents64",
    "umask", "utime", "utimes", "utimensat", "utimensat_time64", "futimesat", "flock", "fcntl", "fcntl64",
    "dup", "dup2", "dup3", "pipe", "pipe2", "splice", "tee", "vmsplice", "sendfile", "sendfile64",
    "copy_file_range", "ioctl", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "name_to_handle_at",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
    # memory
    "brk", "mmap", "mmap2", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "mlock", "mlock2",
    "mlockall", "munlock", "munlockall", "membarrier", "memfd_create", "remap_file_pages", "pkey_alloc",
    "pkey_free", "pkey_mprotect",
    # processes, threads, signals, scheduling (clone, personality: below, by their arguments)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "waitpid", "kill", "tkill",
    "tgkill", "pidfd_open", "pidfd_send_signal", "process_mrelease", "getpid", "getppid", "gettid", "getpgid",
    "getpgrp", "setpgid", "getsid", "setsid", "getuid", "getuid32", "geteuid", "geteuid32", "getgid", "getgid32",
    "getegid", "getegid32", "getresuid", "getresuid32", "getresgid", "getresgid32", "getgroups", "getgroups32",
    "setuid", "setuid32", "setgid", "setgid32", "setreuid", "setreuid32", "setregid", "setregid32", "setresuid",
    "setresuid32", "setresgid", "setresgid32", "setgroups", "setgroups32", "setfsuid", "setfsuid32", "setfsgid",
    "setfsgid32", "capget", "capset", "prctl", "arch_prctl", "seccomp", "getrlimit", "ugetrlimit", "setrlimit",
    "prlimit64", "getrusage", "getpriority", "setpriority", "ioprio_get", "ioprio_set", "sched_yield",
    "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_setparam", "sched_getscheduler",
    "sched_setscheduler", "sched_getattr", "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "sched_rr_get_interval_time64", "set_tid_address", "set_robust_list",
    "get_robust_list", "rseq", "futex", "futex_time64", "futex_waitv", "get_thread_area", "set_thread_area",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "sigreturn", "sigprocmask",
    "signalfd", "signalfd4", "pause", "restart_syscall", "getcpu", "uname", "sysinfo",
    # time and waiting
    "clock_gettime", "clock_gettime64", "clock_getres", "clock_getres_time64", "clock_nanosleep",
    "clock_nanosleep_time64", "nanosleep", "gettimeofday", "time", "times", "alarm", "getitimer", "setitimer",
    "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime",
    "timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
    "timerfd_settime64", "eventfd", "eventfd2", "poll", "ppoll", "ppoll_time64", "select", "_newselect",
    "pselect6", "pselect6_time64", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait",
    "epoll_pwait2", "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    "io_pgetevents_time64", "getrandom",
    # sockets (the sandbox has no network: the kernel's ZMQ channels are unix sockets; socket: below)
    "socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "getsockopt",
    "setsockopt", "send", "sendto", "sendmsg", "sendmmsg", "recv", "recvfrom", "recvmsg", "recvmmsg",
    "recvmmsg_time64", "shutdown",
    # SysV and POSIX IPC: each kernel's own IPC namespace holds them (see the module's docstring)
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semtimedop_time64", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedsend_time64",
    "mq_timedreceive", "mq_timedreceive_time64", "mq_notify", "mq_getsetattr",
    # Landlock only ever narrows what the caller may do
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
)

# Never allowed, by family: the tests try each (tests/test_syscall_profile.py), and :func:`program` refuses a
# profile that would allow one of them.
DENIED = {
    "kernel keyring": ("keyctl", "add_key", "request_key"),
    "bpf": ("bpf",),
    "perf_event_open": ("perf_event_open",),
    "userfaultfd": ("userfaultfd",),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "tracing another process": ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
                                "process_madvise"),
    "mounting": ("mount", "umount", "umount2", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
                 "open_tree", "mount_setattr", "pivot_root", "chroot", "quotactl", "quotactl_fd"),
    "namespaces": ("unshare", "setns", "clone3"),  # clone: allowed only without a namespace flag
    "kexec and reboot": ("kexec_load", "kexec_file_load", "reboot"),
    "kernel modules": ("init_module", "finit_module", "delete_module"),
    "system settings": ("sethostname", "setdomainname", "settimeofday", "clock_settime", "clock_adjtime",
                        "adjtimex", "syslog", "acct", "swapon", "swapoff", "vhangup", "iopl", "ioperm",
                        "modify_ldt", "lookup_dcookie", "open_by_handle_at", "fanotify_init", "mknod", "mknodat",
                        "nfsservctl", "uselib", "_sysctl"),
    "memory policy": ("mbind", "set_mempolicy", "migrate_pages", "move_pages"),
}


class ProfileUnavailable(RuntimeError):
    """The profile cannot be built here: nothing may run in a sandbox without it."""


def _seccomp():
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: pyseccomp found no libseccomp
        raise ProfileUnavailable(
            f"the sandbox's syscall profile cannot be built: {exc}. Install libseccomp2 (apt-get install "
            "libseccomp2) and the course's pinned pyseccomp (./course setup); nothing is graded without it") from exc
    return pyseccomp


@functools.cache
def program(kind: str = "kernel", machine: str | None = None) -> bytes:
    """The ``kind`` profile for ``machine`` (this one by default) as a classic BPF program: ``struct sock_filter``
    records in the native byte order, ready for ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)``."""
    machine = machine or platform.machine()
    if machine not in MACHINES:
        raise ProfileUnavailable(f"the sandbox's syscall profile knows {' and '.join(MACHINES)}, not {machine}")
    if kind not in KINDS:
        raise ValueError(f"no syscall profile {kind!r}: one of {', '.join(KINDS)}")
    if denied := sorted(set(ALLOWED) & {name for names in DENIED.values() for name in names}):
        raise ProfileUnavailable(f"the syscall profile both allows and denies {', '.join(denied)}")
    seccomp = _seccomp()
    arch = getattr(seccomp.Arch, MACHINES[machine])
    try:
        rules = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))
        if arch != seccomp.system_arch():  # a profile for another machine (the tests build both)
            rules.add_arch(arch)
            rules.remove_arch(seccomp.Arch.NATIVE)
        rules.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.ERRNO(errno.EPERM))
        rules.set_attr(seccomp.Attr.CTL_NNP, 0)  # the launcher sets no_new_privs itself, before loading it
        try:
            rules.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)  # a binary tree: a few comparisons per call, not ~300
        except OSError:
            pass  # a libseccomp before 2.5: a list, as strict
        for name in ALLOWED:
            if _known(seccomp, arch, name):
                rules.add_rule(seccomp.ALLOW, name)
        rules.add_rule(seccomp.ALLOW, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, NAMESPACE_FLAGS, 0))
        rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        rules.add_rule(seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.NE, AF_VSOCK))
        for persona in PERSONALITIES:
            rules.add_rule(seccomp.ALLOW, "personality", seccomp.Arg(0, seccomp.EQ, persona))
        if kind == "zygote":
            rules.add_rule(seccomp.ALLOW, "unshare", seccomp.Arg(0, seccomp.EQ, CLONE_NEWIPC))
        with tempfile.TemporaryFile() as exported:
            rules.export_bpf(exported)
            exported.seek(0)
            bpf = exported.read()
    except OSError as exc:
        raise ProfileUnavailable(f"libseccomp could not build the sandbox's syscall profile: {exc}") from exc
    if not bpf or len(bpf) % 8 or len(bpf) // 8 > BPF_MAX_INSTRUCTIONS:
        raise ProfileUnavailable(f"libseccomp built a syscall profile of {len(bpf)} bytes: not a loadable program")
    return bpf


def _known(seccomp, arch: int, name: str) -> bool:
    """Whether this libseccomp knows the call by name (on some machine: a negative number is its stand-in for a
    call that ``arch`` lacks, which it then leaves out); an unknown name is left out of the profile, so denied."""
    return seccomp.resolve_syscall(arch, name) != -1 or seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) != -1


# Loads a program on the student's side (no libseccomp there): part of the launcher's and the zygote's code.
# load_seccomp(hex) -> '' once loaded, else why not; the caller then runs nothing.
LOADER = r"""
def load_seccomp(program_hex):
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    program = bytes.fromhex(program_hex)
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: no setuid binary helps; a filter may be set
        return f"no_new_privs was refused ({os.strerror(ctypes.get_errno())})"
    if libc.prctl(22, 2, ctypes.byref(Program(len(program) // 8, program)), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        return f"the seccomp filter was refused ({os.strerror(ctypes.get_errno())})"
    return ""
"""

"""One uid per live sandbox, grading as root: no two sandboxes share one, whichever grading process made them.

A uid is the last thing that sets two sandboxes apart where the kernel keeps state per uid rather than per
namespace: the kernel keyring (a user's keyring is found by its uid; the key syscalls are denied as well, see
``autograder.sandbox.syscall_profile``), ``RLIMIT_NPROC`` (counted per uid: two sandboxes of one uid would share one
process budget), signals and ``/proc`` of processes that outlived a kill. One uid per grading worker, as before,
gave every sandbox that worker ran (a warm one and a cold one at once, say) the same uid.

A lease is a lock file named by the uid in a folder only root may write (:func:`lock_folder`), held with
``flock`` for as long as the sandbox lives. The lock goes with its holder, however that process ends: a
killed grading process leaves no uid taken. The uids lie in ``UID_BASE`` .. ``UID_BASE + UID_COUNT``, and one
that an account or group of this machine has is skipped. Releasing a lease unlinks its file while still holding
the lock; a process that opened that file just before finds, once it holds the lock, that the name now names
another file (or none), and tries the next uid. Without root every sandbox runs as the grading process's own uid
(bubblewrap maps it in a user namespace of the sandbox's own).
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import stat
import tempfile
from pathlib import Path

UID_BASE = 10_000_000  # sandbox uids (root only), owned by no account
UID_COUNT = 1_000_000
LOCK_FOLDERS = (Path("/run/decoder-course-sandbox-uids"),
                Path(tempfile.gettempdir()) / "decoder-course-sandbox-uids")


_EVER: set[int] = set()  # every uid this process has leased: what to look for once its sandboxes are gone


class NoUidLeft(RuntimeError):
    """No sandbox uid could be leased: every one is taken, or the lock folder cannot be trusted."""


class UidLease:
    """A sandbox's uid, held until :meth:`release` (or until this object, or its process, goes)."""

    def __init__(self, uid: int, path: Path | None = None, fd: int = -1):
        self.uid, self.path, self.fd, self.pid = uid, path, fd, os.getpid()

    @property
    def held(self) -> bool:
        return self.fd >= 0

    def release(self) -> None:
        """Give the uid back: unlink the lock file while still holding it, then let go. Only the process that
        took the lease gives it back (a forked child's copy of it is not its own)."""
        if self.fd < 0 or self.pid != os.getpid():
            return
        fd, self.fd = self.fd, -1
        try:
            if self.path is not None:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # at interpreter exit the modules it needs may be gone: the lock goes with the process
            pass

    def __repr__(self) -> str:
        return f"UidLease(uid={self.uid}, held={self.held})"


def lock_folder() -> Path:
    """The first of :data:`LOCK_FOLDERS` that is root's alone (made so if missing): a folder another account
    could write would let it hold every uid, or hand two sandboxes one."""
    problems = []
    for folder in LOCK_FOLDERS:
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            info = folder.lstat()
        except OSError as exc:
            problems.append(f"{folder}: {exc.strerror}")
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o077:
            return folder
        problems.append(f"{folder}: not a folder that root alone may write")
    raise NoUidLeft(f"no folder to lease sandbox uids in ({'; '.join(problems)}): remove what is there, "
                    "or make it root's with mode 0700")


def lease(start: int | None = None) -> UidLease:
    """A uid of its own for a new sandbox: the first free one from ``start`` (by default this process's pid in
    the range, so that a process's first sandbox gets the uid it always got). Without root: this process's uid,
    held by nothing (every sandbox of an unprivileged grader is its own user namespace)."""
    if os.geteuid() != 0:
        return UidLease(os.geteuid())
    folder = lock_folder()
    first = os.getpid() if start is None else start
    for step in range(UID_COUNT):
        uid = UID_BASE + (first + step) % UID_COUNT
        if _has_account(uid):
            continue
        path = folder / str(uid)
        fd = _locked(path)
        if fd >= 0:
            _EVER.add(uid)
            return UidLease(uid, path, fd)
    raise NoUidLeft(f"all {UID_COUNT} sandbox uids are taken")


def is_sandbox_uid(uid: int) -> bool:
    return UID_BASE <= uid < UID_BASE + UID_COUNT


def ever_leased() -> frozenset[int]:
    """The uids this process's sandboxes ran as (as root): none of them should run anything once they are gone."""
    return frozenset(_EVER)


def _locked(path: Path) -> int:
    """An open descriptor holding ``path``'s lock, or -1 when another lease holds it (or just released it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError:  # BlockingIOError: held; FileNotFoundError: released meanwhile
        pass
    os.close(fd)
    return -1


def _has_account(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


def running(uid: int) -> list[int]:
    """Live processes (not zombies) of ``uid``: a lease is given back only once there is none."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    found.append(int(name))
        except (OSError, IndexError):
            continue
    return found

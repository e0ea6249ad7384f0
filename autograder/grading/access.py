"""Who else can read the instructor's tree: the checkout holds the solutions (``solutions/``), the references and
hidden checks (``autograder/``), and its work folder the gradebook, the grading secret and every student's
feedback. On a shared machine (a JupyterHub whose students have unix accounts on it) the usual ``755`` home folder
lets any of them read all of that.

So on such a machine ``./course setup``, ``release`` and ``grade`` refuse to run while another account can read,
list or change the checkout, ``solutions/``, ``autograder/``, the work folder or the gradebook, or can replace one
of their parent folders (:func:`exposures`); the message names each path and the one command that fixes it,
``./course lock-down`` (:func:`lock_down`: ``chmod go-rwx`` on those, the folders of this account above them
``chmod go-w``). Everything the grader writes is private wherever it runs: the work folder is ``0700``
(:func:`private_folder`), the gradebook ``0600``, the secret ``0600``, a release's staging folder ``0700``.

When is the machine shared (:func:`shared`)? ``$DECODER_COURSE_SHARED=1`` says it is, ``0`` that the machine is
the instructor's alone; unset, it is when the hub's exchange (``/srv/nbgrader/exchange``, docs/INSTRUCTOR.md)
exists here, since students fetch and submit through it from their own accounts. A laptop, CI or a container run
as root is left alone (``./course demo`` and ``./course test`` run as before).

This module imports nothing heavy: ``./course setup`` runs it (``python -m autograder.grading.access check``).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import sys
from pathlib import Path

__all__ = ["HUB_EXCHANGE", "LOCK_DOWN", "SHARED_VAR", "Exposed", "exposures", "lock_down", "private_folder",
           "refuse_if_exposed", "shared"]

ROOT = Path(__file__).resolve().parents[2]
SHARED_VAR = "DECODER_COURSE_SHARED"
HUB_EXCHANGE = Path("/srv/nbgrader/exchange")
LOCK_DOWN = "./course lock-down"


class Exposed(RuntimeError):
    """The instructor's tree can be read or changed by other accounts; the message names each path and the fix."""


def shared() -> bool:
    """Whether other people's accounts use this machine (see the module doc)."""
    said = os.environ.get(SHARED_VAR, "").strip()
    if said in ("0", "1"):
        return said == "1"
    return HUB_EXCHANGE.is_dir()


def private_folder(path: Path) -> Path:
    """``path`` made (with its parents) and, when this account owns it, closed to every other account (0700)."""
    path.mkdir(parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def private_file(path: Path) -> None:
    """``path``, when it exists and is this account's, readable and writable by this account alone (0600)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if info.st_uid == os.geteuid() and info.st_mode & 0o077:
        path.chmod(info.st_mode & 0o700)


def _group_has_others(gid: int) -> bool:
    """Whether an account other than this one belongs to group ``gid`` (as a member, or as its primary group)."""
    me = os.geteuid()
    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    members.discard(pwd.getpwuid(me).pw_name if _known(me) else "")
    return bool(members) or any(entry.pw_gid == gid and entry.pw_uid != me for entry in pwd.getpwall())


def _known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _others(info: os.stat_result) -> tuple[str, int]:
    """(who, permission bits) other accounts have on a file: another owner (not root) has all of them; else the
    "other" bits, and the group's when another account is in the group."""
    if info.st_uid not in (os.geteuid(), 0):
        owner = pwd.getpwuid(info.st_uid).pw_name if _known(info.st_uid) else f"uid {info.st_uid}"
        return f"its owner {owner}", 0o7
    bits, who = info.st_mode & 0o007, "every account"
    if info.st_mode & 0o070 and _group_has_others(info.st_gid):
        bits |= (info.st_mode & 0o070) >> 3
        who = "every account" if info.st_mode & 0o007 else "the other accounts of its group"
    return who, bits


def _exposure(path: Path) -> tuple[str, Path] | None:
    """(why other accounts can read, list or change ``path``, the folder to change), or None."""
    path = Path(os.path.abspath(path))
    for folder in reversed(path.parents):
        info = os.stat(folder)
        who, bits = _others(info)
        if bits & 0o2 and not info.st_mode & stat.S_ISVTX:
            return f"{folder} can be changed by {who} (mode {stat.filemode(info.st_mode)}): they could put a " \
                   f"folder of their own in place of {path}", folder
        if not bits & 0o1:
            return None  # they cannot pass this folder: nothing below it is theirs to reach
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    who, bits = _others(info)
    if bits & (0o7 if stat.S_ISDIR(info.st_mode) else 0o6):
        what = "entered" if stat.S_ISDIR(info.st_mode) and not bits & 0o6 else "read" if not bits & 0o2 else \
            "changed"
        return f"{path} can be {what} by {who} (mode {stat.filemode(info.st_mode)})", path
    return None


def sqlite_file(db_url: str | None, work: Path) -> Path | None:
    """The gradebook's file: SQLite in ``work`` by default, the path of a ``sqlite:///`` URL; None for a server."""
    if not db_url:
        return work / "gradebook.db"
    return Path(db_url.removeprefix("sqlite:///")) if db_url.startswith("sqlite:///") else None


def guarded(root: Path, work: Path, db_url: str | None = None) -> list[Path]:
    """What must stay the instructor's: the checkout, its solutions and grading code, the work folder, the
    gradebook and the secret."""
    paths = [root, root / "solutions", root / "autograder", work, work / "secret"]
    gradebook = sqlite_file(db_url, work)
    return paths + ([gradebook] if gradebook else [])


def exposures(root: Path = ROOT, work: Path | None = None, db_url: str | None = None) -> list[str]:
    """Why other accounts can read or change the instructor's tree (:func:`guarded`): one line per path; [] when
    they cannot."""
    found: dict[str, None] = {}
    for path in guarded(root, work or root / ".grading", db_url):
        why = _exposure(path)
        if why:
            found[why[0]] = None
    return list(found)


def refuse_if_exposed(root: Path = ROOT, work: Path | None = None, db_url: str | None = None) -> None:
    """On a shared machine (:func:`shared`), raise :class:`Exposed` when other accounts can read or change the
    instructor's tree, with the one command that closes it; nothing anywhere else."""
    if not shared():
        return
    found = exposures(root, work, db_url)
    if found:
        raise Exposed("other accounts on this machine can reach the course's solutions, grading code or gradebook "
                      "(this machine is shared: " + (f"${SHARED_VAR}=1" if os.environ.get(SHARED_VAR) else
                                                     f"{HUB_EXCHANGE} is here") + "):\n"
                      + "\n".join(f"  {line}" for line in found)
                      + f"\nNothing was run. Close them with: {LOCK_DOWN}"
                      + (f" --work {work}" if work and Path(work).resolve() != (root / '.grading').resolve() else "")
                      + f" (chmod go-rwx on each; or set {SHARED_VAR}=0 if no one else uses this machine)")


def lock_down(root: Path = ROOT, work: Path | None = None, db_url: str | None = None) -> list[str]:
    """Close the instructor's tree to other accounts: ``chmod go-rwx`` on each guarded path of this account, and
    ``chmod go-w`` on the folders of this account above them; what it changed, one line each, then what only
    another account (root) can change, with the command for it."""
    work = work or root / ".grading"
    private_folder(work)
    done, left = [], []
    for path in guarded(root, work, db_url):
        why = _exposure(path)
        if why is None:
            continue
        target = why[1]
        info = os.stat(target)
        if info.st_uid != os.geteuid():
            left.append(f"{why[0]}: as its owner, run chmod go-w {target}" if target != path else
                        f"{why[0]}: it is not yours; as its owner, run chmod go-rwx {target}")
            continue
        mode = info.st_mode & (0o7755 if target != path else 0o7700)
        target.chmod(stat.S_IMODE(mode))
        done.append(f"{target}: {stat.filemode(info.st_mode)} -> {stat.filemode(stat.S_IFMT(info.st_mode) | mode)}")
        if _exposure(path):  # a folder further up, or another path's turn
            return done + lock_down(root, work, db_url)
    return done + [f"left: {line}" for line in left]


def main(argv: list[str] | None = None) -> int:
    """``check`` (``./course setup``): make the work folder private, and on a shared machine refuse an open tree;
    ``lock-down [--work DIR] [--db-url URL]`` (``./course lock-down``): close it."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "check"
    options = dict(zip(args[::2], args[1::2]))
    work = Path(options.get("--work") or os.environ.get("DECODER_COURSE_WORK") or ROOT / ".grading")
    db_url = options.get("--db-url") or os.environ.get("GRADEBOOK_URL") or None
    if command == "lock-down":
        changed = lock_down(ROOT, work, db_url)
        for line in changed:
            print(line)
        left = exposures(ROOT, work, db_url)
        print(f"other accounts can no longer read {ROOT} or {work}" if not left else
              "still open:\n" + "\n".join(f"  {line}" for line in left))
        return 0 if not left else 1
    if command != "check":
        print("usage: python -m autograder.grading.access [check | lock-down [--work DIR] [--db-url URL]]",
              file=sys.stderr)
        return 2
    private_folder(work)
    try:
        refuse_if_exposed(ROOT, work, db_url)
    except Exposed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

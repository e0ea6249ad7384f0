"""Every path a student's kernel can write is a file system with its own cap, enforced by the kernel, not watched.

Grading as root, each sandbox gets tmpfs mounts of its own (``autograder.sandbox.launch.mount_tmpfs``): one for
``$HOME``, ``/tmp`` and ``/dev/shm`` together, one for the harvest outputs, one for the kernel's sockets. The tests
below run plain processes in a sandbox (no kernel) and try every way of taking space there: writing, reserving
without writing (fallocate), sparse files, many empty files, a tree deeper than PATH_MAX, files left behind by a
process that outlives its parent. A write past a cap fails in the student's own process; the grader never walks
a tree to enforce a cap, and a tree it cannot walk costs no grade (the warm sandbox that holds one is retired).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from autograder.sandbox import launch as sandbox
from autograder.sandbox import warm

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the grader mounts capped file systems as root only")

MB = 1 << 20
LIMITS = replace(sandbox.Limits(), cpu_seconds=30, memory_bytes=1 << 30, processes=32, file_bytes=16 * MB,
                 tmpfs_bytes=8 * MB, scratch_bytes=6 * MB, inodes=400)
# Each writable path and the cap it must meet (bytes).
PLACES = {"/home/student": LIMITS.tmpfs_bytes, "/tmp": LIMITS.tmpfs_bytes, "/dev/shm": LIMITS.tmpfs_bytes,
          "/harvest/outputs": LIMITS.scratch_bytes}

# One script per way of taking space; each prints a JSON line: {place: result}. Every one first empties its place,
# so the places on one file system do not eat each other's room.
_PRELUDE = r"""
import errno, json, os, shutil, sys
places = json.loads(sys.argv[1])
def err(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno))
def clear(place):
    for name in os.listdir(place):
        path = os.path.join(place, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
out = {}
"""
WAYS = {
    "write": """
for place in places:
    written = 0
    try:
        for i in range(64):
            with open(os.path.join(place, f"f{i}"), "wb") as handle:
                for _ in range(8):
                    handle.write(b"x" * (1 << 20)); handle.flush(); written += 1 << 20
        out[place] = ["ok", written]
    except OSError as exc:
        out[place] = [err(exc), written]
    clear(place)
""",
    "fallocate": """
for place in places:
    fd = os.open(os.path.join(place, "reserved"), os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, 15 << 20)  # under RLIMIT_FSIZE, over every cap
        out[place] = ["ok", os.fstat(fd).st_blocks * 512]
    except OSError as exc:
        out[place] = [err(exc), os.fstat(fd).st_blocks * 512]
    os.close(fd)
    clear(place)
""",
    "sparse": """
for place in places:
    path = os.path.join(place, "sparse")
    with open(path, "wb") as handle:
        handle.truncate(15 << 20)  # an apparent size past every cap, with nothing in it
        handle.seek(10 << 20); handle.write(b"end")
    info = os.stat(path)
    out[place] = ["ok", info.st_size, info.st_blocks * 512]
    clear(place)
""",
    "files": """
for place in places:
    made = 0
    try:
        while made < 100000:
            open(os.path.join(place, f"e{made}"), "w").close(); made += 1
        out[place] = ["ok", made]
    except OSError as exc:
        out[place] = [err(exc), made]
    clear(place)
""",
    "deep": """
for place in places:
    os.chdir(place)
    depth = 0
    try:
        while depth < 100000:  # 4096 bytes of path (PATH_MAX) is about 400 levels of 10 characters
            os.mkdir("d" * 9); os.chdir("d" * 9); depth += 1
        out[place] = ["ok", depth]
    except OSError as exc:
        out[place] = [err(exc), depth]
    for _ in range(depth):  # back up, removing the tree level by level: the next place shares the room
        os.chdir(".."); os.rmdir("d" * 9)
    os.chdir("/")
""",
}


def _box(tmp_path, limits=LIMITS) -> sandbox.Sandbox:
    box = sandbox.Sandbox(tmp_path / "box", limits)
    box.prepare()
    box.seal()
    return box


def _run(box: sandbox.Sandbox, code: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(box.command([sys.executable, "-c", code, *argv]), env=box.outer_env(), cwd=box.scratch,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def taken(tmp_path_factory):
    """Every way of taking space, run once in one sandbox: {way: {place: result}}."""
    box = _box(tmp_path_factory.mktemp("capped"))
    found = {}
    try:
        for way, body in WAYS.items():
            done = _run(box, _PRELUDE + body + "\nprint(json.dumps(out))", json.dumps(list(PLACES)))
            assert done.returncode == 0, f"{way}: {done.stderr[-800:]}"
            found[way] = json.loads(done.stdout.splitlines()[-1])
    finally:
        box.release()
    return found


@pytest.mark.parametrize("place", PLACES)
def test_writing_stops_at_the_cap_with_enospc(taken, place):
    status, written = taken["write"][place]
    assert status == "ENOSPC", f"{place}: {written / MB:.1f} MB written past a {PLACES[place] / MB:g} MB cap"
    assert PLACES[place] - MB <= written <= PLACES[place], f"{place}: {written / MB:.1f} MB"


@pytest.mark.parametrize("place", PLACES)
def test_reserving_without_writing_counts_as_writing(taken, place):
    status, reserved = taken["fallocate"][place]
    assert status == "ENOSPC" and reserved <= PLACES[place], f"{place}: fallocate of 15 MB gave {status}, " \
                                                              f"{reserved / MB:.1f} MB reserved"


@pytest.mark.parametrize("place", PLACES)
def test_a_sparse_file_takes_only_what_it_holds(taken, place):
    status, size, used = taken["sparse"][place]
    assert status == "ok" and size == 15 * MB and used < MB, (status, size, used)


@pytest.mark.parametrize("place", PLACES)
def test_many_empty_files_stop_at_the_inode_cap(taken, place):
    status, made = taken["files"][place]
    assert status == "ENOSPC" and made < LIMITS.inodes, f"{place}: {made} files, {status}"


@pytest.mark.parametrize("place", PLACES)
def test_a_tree_deeper_than_path_max_stops_at_the_inode_cap(taken, place):
    status, depth = taken["deep"][place]
    assert status == "ENOSPC" and depth < LIMITS.inodes, f"{place}: {depth} levels, {status}"
    # deeper than any path the grader could name: 10 characters a level
    assert depth * 10 > 4096 // 2, f"{place}: only {depth} levels: the test did not reach a deep tree"


@pytest.mark.parametrize("fill", ["bytes", "inodes"])
def test_the_grader_says_which_cap_was_reached_without_walking(tmp_path, fill):
    """Asked of the kernel (statvfs): the log names the file system, never a sum over the files."""
    writes = ("with open(f'{p}/x', 'wb') as h:\n  try:\n   while True: h.write(b'x' * 65536); h.flush()\n"
              "  except OSError: pass" if fill == "bytes" else
              "i = 0\n try:\n  while True: open(f'{p}/e{i}', 'w').close(); i += 1\n except OSError: pass")
    code = f"for p in ('/dev/shm', '/harvest/outputs'):\n {writes}"
    box = _box(tmp_path)
    try:
        assert box.full() == []
        done = _run(box, code)
        assert done.returncode == 0, done.stderr[-500:]
        said = box.full()
    finally:
        box.release()
    assert len(said) == 2 and "filled /home/student, /tmp and /dev/shm (cap 8 MB" in said[0], said
    assert "filled the harvest outputs (cap 6 MB, 400 files and folders)" in said[1], said


def test_files_left_by_a_process_that_outlives_its_parent_still_count(tmp_path):
    """A daemon keeps writing after the notebook's process is gone: the cap holds, then the sandbox is killed and
    its file systems unmounted, with nothing walked."""
    code = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    with open("/tmp/left", "wb") as handle:
        try:
            while True:
                handle.write(b"x" * (1 << 20)); handle.flush()
        except OSError:
            pass
    time.sleep(600)
time.sleep(0.5)
"""
    box = _box(tmp_path)
    process = subprocess.Popen(box.command([sys.executable, "-c", code]), env=box.outer_env(), cwd=box.scratch)
    try:
        process.wait(timeout=60)
        used = sandbox.usage(box.space)
        assert used is not None and used.used_bytes <= LIMITS.tmpfs_bytes, used
        assert used.used_bytes > LIMITS.tmpfs_bytes // 2, f"the daemon wrote only {used.used_bytes} bytes"
    finally:
        box.kill()
        box.release()
    assert str(box.space) not in open("/proc/mounts").read(), "the sandbox's file system outlived it"


def test_the_grader_never_walks_the_trees_it_caps(tmp_path, monkeypatch):
    """The watchdog of a root sandbox asks nothing of the trees: a walk is recorded here (an exception would die
    with the watchdog's thread, unseen), and the watchdog's deadline check shows it ran meanwhile."""
    walks = []
    monkeypatch.setattr(sandbox.Sandbox, "scratch_usage", lambda self: walks.append(self) or 0)
    box = _box(tmp_path, replace(LIMITS, deadline=60))
    process = subprocess.Popen(box.command([sys.executable, "-c", "import time; time.sleep(1.5)"]),
                               env=box.outer_env(), cwd=box.scratch)
    box.started(process)
    try:
        assert process.wait(timeout=30) == 0 and not box.events, box.events
        assert box.pid_ns, "the watchdog never ran: this test would prove nothing"
        assert walks == [], f"the grader walked the sandbox's trees {len(walks)} times"
    finally:
        box.kill()
        box.release()


def test_mounts_are_released_even_when_nothing_else_cleans_up(tmp_path):
    box = _box(tmp_path)
    mounted = [str(folder) for folder, _, _ in box.capped().values()]
    assert all(path in open("/proc/mounts").read() for path in mounted)
    sandbox.unmount_all()  # what atexit does
    text = open("/proc/mounts").read()
    assert not any(path in text for path in mounted), "a capped tmpfs outlived the grading process's exit"


def test_a_tree_too_deep_to_walk_retires_the_warm_sandbox_and_costs_no_grade(tmp_path):
    """A notebook leaves a tree nobody can walk (deeper than Python's recursion and PATH_MAX): emptying fails,
    the kernel's count shows it, the sandbox is retired (no grade involved); the next one starts clean."""
    box = warm.WarmSandbox(tmp_path / "warm", replace(LIMITS, inodes=3000), student="s")
    box.start()
    try:
        assert box.fresh, "the warm sandbox recorded no fresh state"
        code = """
import os
for place in ("/tmp", "/harvest/outputs"):
    os.chdir(place)
    for _ in range(1200):
        os.mkdir("dddd"); os.chdir("dddd")
"""
        done = _run(box, code)  # a second process in the same mounts, as a notebook's would be
        assert done.returncode == 0, done.stderr[-500:]
        box.next_notebook(wants_torch=False)
        box.finish_notebook()
        assert box.retired, "a sandbox still holding the previous notebook's tree was kept for the next one"
    finally:
        box.retire()
    fresh = warm.WarmSandbox(tmp_path / "warm2", LIMITS, student="s")
    fresh.start()
    try:
        assert sandbox.usage(fresh.space).used_inodes == fresh.fresh[f"{sandbox.HOME}, /tmp and /dev/shm inodes"]
    finally:
        fresh.retire()


def test_outputs_handed_in_again_replace_the_last_round_across_file_systems(tmp_path):
    """Answer rounds hand an item's outputs in once per round (``verdicts.answer_rounds``): from the capped outputs
    (a tmpfs of their own) each copy replaces the last, as the rename on one file system does; a link still
    arrives as a link (refused when read), and a plain file after it replaces the link, without following it."""
    from autograder.course.checks.framework import take_out

    outputs, collected = tmp_path / "outputs", tmp_path / "collected"
    outputs.mkdir()
    collected.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("the grader's")
    sandbox.mount_tmpfs(outputs, MB, 100)
    try:
        for round_, kind in enumerate(["plain", "plain", "link", "plain"]):
            handed_in = outputs / "item.json"
            if kind == "link":
                handed_in.symlink_to(target)
            else:
                handed_in.write_text(f"round {round_}")
            take_out(handed_in, collected / "item.json")
            dest = collected / "item.json"
            assert not handed_in.exists() and not handed_in.is_symlink()
            if kind == "link":
                assert dest.is_symlink() and os.readlink(dest) == "not a plain file"
            else:
                assert not dest.is_symlink() and dest.read_text() == f"round {round_}"
        assert target.read_text() == "the grader's"
    finally:
        sandbox.unmount(outputs)


def test_mounts_of_a_killed_grading_process_are_swept_by_the_next(tmp_path):
    """A grading process killed before it retires its sandbox cannot unmount anything: the next one does, and
    leaves a live process's mounts alone."""
    code = (f"import sys, time; sys.path.insert(0, {str(sandbox.Path(__file__).parent.parent)!r}); "
            "from autograder.sandbox import launch as sandbox; from dataclasses import replace; "
            f"box = sandbox.Sandbox(sandbox.Path({str(tmp_path / 'killed')!r}), sandbox.Limits()); box.prepare(); "
            "print('ready', flush=True); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
    finally:
        process.kill()
        process.wait()
    live = _box(tmp_path)
    try:
        left = [line.split()[1] for line in open("/proc/mounts") if str(tmp_path / "killed") in line]
        assert len(left) == 4, left
        swept = sandbox.sweep_stale()
        assert sorted(swept) == sorted(left), swept
        mounts = open("/proc/mounts").read()
        assert str(tmp_path / "killed") not in mounts and str(live.space) in mounts
    finally:
        live.release()

"""A shared hub: no other account reads the instructor's tree (autograder/grading/access.py).

A real second unix account (a student's, made with ``useradd`` as tests/test_exchange.py does) tries to read a
solution, a reference, the gradebook, the secret and another student's feedback in an instructor's checkout laid
out as the course's, inside a folder every account can pass (as a ``755`` home folder is). Before
``./course lock-down`` it can (so the test can tell), the course sees it and, on a shared machine, refuses to run
with the command that fixes it; after, every read is refused by the kernel and the course runs.
"""

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from autograder.__main__ import main
from autograder.grading import access
from tests.test_exchange import _accounts

SECRETS = ["solutions/01-masks.py", "autograder/course/reference/masks.py", ".grading/gradebook.db", ".grading/secret",
           ".grading/feedback/bob/01-masks/01-masks.html"]


@pytest.fixture(scope="module")
def student():
    with _accounts("reader") as (entry,):
        yield entry


@pytest.fixture
def checkout():
    """An instructor's checkout as git and nbgrader leave it (folders 755, files 644, the secret 600), in a folder
    other accounts can pass."""
    home = Path(tempfile.mkdtemp(prefix="instructor-home-"))
    home.chmod(0o755)
    root = home / "decoder-course"
    for name in SECRETS:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"the instructor's {name}\n")
        path.chmod(0o600 if name.endswith("secret") else 0o644)
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    yield root
    shutil.rmtree(home, ignore_errors=True)


def _reads(user: str, path: Path) -> bool:
    done = subprocess.run(["runuser", "-u", user, "--", "cat", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 or "Permission denied" in done.stderr, done.stderr
    return done.returncode == 0


def test_a_student_account_reads_nothing_of_a_locked_down_checkout(student, checkout, monkeypatch):
    user, work = student.pw_name, checkout / ".grading"
    readable = [name for name in SECRETS if _reads(user, checkout / name)]
    assert readable == [name for name in SECRETS if not name.endswith("secret")]  # as the issue found it
    found = access.exposures(checkout, work)
    assert any(str(checkout) in line and "entered" not in line for line in found), found
    monkeypatch.setenv(access.SHARED_VAR, "1")
    with pytest.raises(access.Exposed, match="./course lock-down"):
        access.refuse_if_exposed(checkout, work)

    changed = access.lock_down(checkout, work)
    assert changed and not [line for line in changed if line.startswith("left:")], changed
    assert [name for name in SECRETS if _reads(user, checkout / name)] == []
    assert not _reads(user, checkout / "solutions")  # not even a listing (cat of a folder: refused on the way)
    assert access.exposures(checkout, work) == []
    access.refuse_if_exposed(checkout, work)  # runs now
    assert stat.S_IMODE(checkout.stat().st_mode) == 0o700 and stat.S_IMODE(work.stat().st_mode) == 0o700


@pytest.mark.parametrize("opening", ["others-read", "group-read", "entered-only", "parent-writable"])
def test_each_way_in_is_seen_and_closed(student, checkout, opening):
    access.lock_down(checkout)
    assert access.exposures(checkout) == []
    gradebook = checkout / ".grading" / "gradebook.db"
    if opening == "others-read":
        gradebook.chmod(0o644)
        checkout.chmod(0o711)
        (checkout / ".grading").chmod(0o711)  # a known name is enough: no listing needed
    elif opening == "group-read":  # the student's group: another account in it
        os.chown(checkout, 0, student.pw_gid)
        checkout.chmod(0o750)
        (checkout / "solutions").chmod(0o750)
        os.chown(checkout / "solutions", 0, student.pw_gid)
    elif opening == "entered-only":
        checkout.chmod(0o701)
    else:
        checkout.parent.chmod(0o777)  # anyone may rename the checkout and put their own in its place
    found = access.exposures(checkout)
    assert found, opening
    if opening == "group-read":
        assert any("group" in line for line in found), found
        assert _reads(student.pw_name, checkout / "solutions" / "01-masks.py")  # through the group's x bits
    if opening == "parent-writable":
        assert any(f"{checkout.parent} can be changed" in line for line in found), found
    access.lock_down(checkout)
    assert access.exposures(checkout) == []
    assert [name for name in SECRETS if _reads(student.pw_name, checkout / name)] == []


@pytest.mark.parametrize("said, hub, expected", [("1", False, True), ("0", True, False), ("", True, True),
                                                 ("", False, False)])
def test_a_machine_is_shared_when_said_or_when_the_hub_s_exchange_is_here(tmp_path, monkeypatch, said, hub,
                                                                          expected):
    monkeypatch.setenv(access.SHARED_VAR, said)
    exchange = tmp_path / "exchange"
    if hub:
        exchange.mkdir()
    monkeypatch.setattr(access, "HUB_EXCHANGE", exchange)
    assert access.shared() is expected


@pytest.mark.parametrize("command", ["grade", "release", "demo"])
def test_the_course_refuses_to_run_on_a_shared_machine_with_an_open_checkout(checkout, monkeypatch, capsys,
                                                                          tmp_path, command):
    monkeypatch.setenv(access.SHARED_VAR, "1")
    monkeypatch.setattr(access, "ROOT", checkout)
    work = tmp_path / "work"
    argv = {"grade": ["grade", str(tmp_path), "--work", str(work)], "release": ["release", "--out",
            str(tmp_path / "out")], "demo": ["demo", "--work", str(work)]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "can be read by every account" in err and "Close them with: ./course lock-down" in err
    assert not work.exists() and not (tmp_path / "out").exists()  # nothing ran


def test_the_work_folder_is_made_private_on_any_machine(tmp_path):
    work = tmp_path / "open"
    work.mkdir(mode=0o755)
    work.chmod(0o755)
    access.private_folder(work)
    access.private_folder(tmp_path / "new" / "work")
    assert stat.S_IMODE(work.stat().st_mode) == stat.S_IMODE((tmp_path / "new" / "work").stat().st_mode) == 0o700


def test_setup_s_check_refuses_and_lock_down_fixes(checkout, monkeypatch, capsys):
    """``./course setup`` runs ``python -m autograder.grading.access check``; ``./course lock-down`` its
    ``lock-down``."""
    monkeypatch.setenv(access.SHARED_VAR, "1")
    monkeypatch.setattr(access, "ROOT", checkout)
    monkeypatch.delenv("DECODER_COURSE_WORK", raising=False)
    monkeypatch.delenv("GRADEBOOK_URL", raising=False)
    assert access.main(["check"]) == 1
    assert "Close them with: ./course lock-down" in capsys.readouterr().err
    assert access.main(["lock-down"]) == 0
    said = capsys.readouterr().out
    assert f"{checkout}: drwxr-xr-x -> drwx------" in said and "can no longer read" in said
    assert access.main(["check"]) == 0

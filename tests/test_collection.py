"""The suite collects the same tests wherever and whenever it is collected.

pytest-xdist refuses a whole run (``Different tests were collected between gw0 and gw1``) when its workers collect
different node ids. A test id built from the clock (a parameter formatted from ``datetime.now()`` at import) differs
between two workers that import the module on either side of a second boundary: any CI run can fail that way by
chance. So ids name the case, never the time; this module collects the whole suite in two processes started over
a second apart and compares what they found, and proves on a planted module that the comparison sees a clock in
an id.
"""

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import NOW, NOW_ENV, ROOT


def _collecting(folder: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-p", "no:randomly", str(folder)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _ids(process: subprocess.Popen) -> list[str]:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out[-3000:]
    return [line for line in out.splitlines() if "::" in line]


def collected_twice_across_a_second(folder: Path, cwd: Path) -> tuple[list[str], list[str]]:
    """Collect ``folder`` in two processes, the second started past the next whole second and 1.2 s after the
    first, so that any id formatted from the clock to the second (or finer) differs between them."""
    first = _collecting(folder, cwd)
    start = time.time()
    time.sleep(max(1.2, 1 - start % 1 + 0.05))
    second = _collecting(folder, cwd)
    return _ids(first), _ids(second)


def test_two_collections_a_second_apart_find_the_same_tests():
    first, second = collected_twice_across_a_second(ROOT / "tests", ROOT)
    assert len(first) > 1000, "the suite collected far fewer tests than it holds"
    only_first, only_second = sorted(set(first) - set(second)), sorted(set(second) - set(first))
    assert not only_first and not only_second, (
        "test ids differ between two collections a second apart: an id is built from the clock (or the machine, "
        f"or import order). Name the case in ids= instead. First only: {only_first[:5]}; second only: "
        f"{only_second[:5]}")
    assert first == second, "the same tests were collected in a different order"


def test_the_comparison_sees_a_clock_in_an_id(tmp_path):
    (tmp_path / "test_planted.py").write_text(
        "from datetime import datetime\nimport pytest\nNOW = datetime.now()\n\n"
        "@pytest.mark.parametrize('when', [f'{NOW:%H:%M:%S}'])\ndef test_when(when):\n    pass\n")
    first, second = collected_twice_across_a_second(tmp_path, tmp_path)
    assert len(first) == len(second) == 1 and first != second


def test_every_process_of_a_run_reads_the_runs_one_clock():
    """``tests.conftest.NOW`` is read once, in the process that starts the run, and handed to its workers through the
    environment: two processes started a second apart, as xdist's workers are, build the same term dates."""
    import os

    program = "from tests.conftest import NOW; print(NOW.isoformat())"
    env = {key: value for key, value in os.environ.items() if key != NOW_ENV}
    env[NOW_ENV] = NOW.isoformat()

    def read() -> str:
        return subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    first = read()
    time.sleep(1.1)
    assert first == read() == NOW.isoformat()
    del env[NOW_ENV]  # a process with no reading handed down reads its own clock
    assert read() != first

"""7. The class of section 3 graded on a Dask cluster of two workers on this machine vs locally: the same CSV.

The cluster is Dask's own commands as an instructor starts them (``docs/INSTRUCTOR.md``): ``dask scheduler`` and
two plain ``dask worker`` processes of the course's venv, one thread each, started in a folder of their own without
``PYTHONPATH`` (the venv brings the grading code). The release and canaries are graded once into a base folder;
each run grades the class into its own copy of it (the same secret, so the same hidden cases): sequentially
(``grade_one`` in a loop, as ``grade_class.grade`` does), then on the cluster (``distributed.grade_on_cluster``).
Each writes its ``grades.csv`` (``pipeline.write_csv``); the two must be the same, byte for byte.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from autograder.course import notebooks
from autograder.grading import pipeline
from bench.common import NOT_AVAILABLE, seconds, table
from bench.grading_class import fresh_copy, grade_in_turn, make_class, sandboxing

WORKERS = 2
BIN = Path(sys.executable).parent


@contextmanager
def local_cluster(folder: Path, workers: int = WORKERS):
    """``dask scheduler`` and ``workers`` ``dask worker`` processes (one thread each) on 127.0.0.1; yields the
    scheduler's address once every worker has joined, and stops them all (their process groups) afterwards."""
    from distributed import Client

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    scheduler_file = folder / "scheduler.json"
    started: list[subprocess.Popen] = []

    def start(name: str, argv: list[str]) -> None:
        (folder / name).mkdir()
        with open(folder / f"{name}.log", "wb") as log:
            started.append(subprocess.Popen(argv, cwd=folder / name, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True))

    try:
        start("scheduler", [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                            "--scheduler-file", str(scheduler_file)])
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            if time.monotonic() > deadline or started[0].poll() is not None:
                raise RuntimeError("the Dask scheduler did not start: "
                                   + (folder / "scheduler.log").read_text(errors="replace")[-1000:])
            time.sleep(0.2)
        time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        for i in range(workers):
            start(f"worker-{i}", [str(BIN / "dask"), "worker", address, "--host", "127.0.0.1", "--nthreads", "1",
                                  "--no-dashboard", "--local-directory", str(folder / f"worker-{i}")])
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        yield address
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


def run(quick: bool = False, students: int | None = None) -> str:
    n_students = students or (2 if quick else 10)
    lessons = [lesson for lesson in notebooks.lessons()
               if (pipeline.LESSONS_DIR / lesson / f"{lesson}.ipynb").exists()]
    if not lessons:
        return NOT_AVAILABLE
    try:
        import distributed  # noqa: F401 - the grader extra's
    except ImportError:
        return "not available (dask and distributed are not installed: `./course setup`)"
    sandbox, note = sandboxing()
    from autograder.grading import cluster as on_dask

    logging.getLogger("autograder").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp:
        root = Path(tmp)
        jobs = make_class(root / "incoming", n_students, lessons)
        pipeline.prepare(root / "base", lessons, sandbox=sandbox)

        local, outcomes, local_s = grade_in_turn(root, "local", jobs, sandbox)
        pipeline.write_csv(local / "grades.csv", outcomes)

        cluster = fresh_copy(root, "cluster")
        (root / "dask").mkdir()
        started = time.perf_counter()
        with local_cluster(root / "dask") as address:
            up_s = time.perf_counter() - started
            started = time.perf_counter()
            outcomes = on_dask.grade_on_cluster(jobs, cluster, None, address, progress=False, sandbox=sandbox)
            dask_s = time.perf_counter() - started
        pipeline.write_csv(cluster / "grades.csv", outcomes)
        here, there = ((work / "grades.csv").read_text().splitlines() for work in (local, cluster))
        if here != there:  # not a missed target: the two ways of grading disagree
            differ = [f"{a!r} != {b!r}" for a, b in zip(here, there) if a != b] or [f"{len(here)} != {len(there)} rows"]
            raise AssertionError("grades.csv differs between local and Dask grading: " + "; ".join(differ[:3]))
        graded = sum(o.ok for o in outcomes)
    n = len(jobs)
    rows = [["local, sequential", n, seconds(local_s), seconds(local_s / n), "—"],
            [f"Dask, {WORKERS} workers on this machine", n, seconds(dask_s), seconds(dask_s / n),
             f"{local_s / dask_s:.2f}×"]]
    return "\n".join([
        table(["grading", "notebooks", "wall", "per notebook", "speed-up"], rows),
        "",
        f"{n_students} students × {len(lessons)} lessons, {note}; the class of section 3. grades.csv identical "
        f"(checked; {graded} of {n} notebooks graded). Starting the cluster (scheduler "
        f"and {WORKERS} `dask worker` processes, without PYTHONPATH): {seconds(up_s)}, not in its wall time. One "
        "run each.",
    ])

"""A pool of grading processes: jobs in, outcomes out, a worker that dies costs nobody their grade.

:func:`run_pool` runs ``task(job)`` for each job in ``workers`` fresh processes (``spawn``), each set up once by
``initializer``; it knows nothing of grading. :func:`autograder.grading.grade_class.grade_many` is its one user: it
hands in the grading of one notebook as the task, so the scores are those of sequential grading; only the order in
which notebooks finish changes. Imports go one way: ``grade_class`` imports this module, never the other way round. What
makes the pool safe for grading:

- **processes, not threads**: ``TrustedExecute`` sets the harvest variable in ``os.environ`` and keeps per-notebook
  state (:data:`autograder.judge.preprocessors.NOTES`) in module globals; each worker is a fresh interpreter that
  builds its own nbgrader API once and grades one notebook at a time;
- **everything shared is written before the pool starts** (by the pipeline): the assignments, the grading secret,
  the canaries and every student's gradebook row (nbgrader's ``update_or_create_student`` looks, then inserts:
  two workers starting the same new student's lessons at once collide on the primary key; measured: 6 of 20
  such pairs failed);
- **one writer at a time in SQLite**: SQLite lets one connection write while the others wait; the default wait
  is 5 s, so the gradebook URL gets ``?timeout=60`` (:func:`gradebook_url`; SQLAlchemy hands it to
  ``sqlite3.connect`` and nbgrader passes the URL through untouched; ``tests/test_scale.py`` proves both).
  PostgreSQL needs nothing;
- **a worker that dies** (killed, out of memory) takes the jobs that were running to a fresh pool once; a job
  caught in two such crashes is reported as failed (``failed(job, why)`` makes its outcome;
  ``tests/test_parallel.py`` proves both).

SQLite or PostgreSQL? SQLite is right for one grading machine, workers included: a notebook's gradebook writes
take milliseconds next to its seconds of execution. Switch to PostgreSQL (``--db-url postgresql://…``; the
driver, psycopg 3, is in the grader extra) when several machines or graders write one gradebook at once (SQLite's
file locks are not reliable on network file systems), or when nbgrader's formgrader runs on a JupyterHub for
several teaching assistants while grading goes on. ``.ci/postgres.sh start DIR`` starts a local server to try it.
Grading on several machines is :mod:`autograder.grading.cluster` (a Dask cluster): there the instructor's process
stays the gradebook's only writer, so SQLite is fine too.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from tqdm.auto import tqdm

__all__ = ["SQLITE_TIMEOUT", "Job", "default_workers", "gradebook_url", "run_pool"]

Job = tuple[str, str, Path]  # (student, lesson, notebook path)
SQLITE_TIMEOUT = 60  # s a SQLite writer waits for another's lock; one notebook's writes take well under 1 s
log = logging.getLogger("autograder")


def default_workers() -> int:
    """One worker per core this process may use (a worker keeps about one core busy: its kernel)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def gradebook_url(work: Path, db_url: str | None = None) -> str:
    """The gradebook URL for concurrent writers: SQLite gets a busy timeout unless the URL sets one."""
    url = make_url(db_url or f"sqlite:///{work / 'gradebook.db'}")
    if url.get_backend_name() == "sqlite" and "timeout" not in url.query:
        url = url.update_query_dict({"timeout": str(SQLITE_TIMEOUT)})
    return url.render_as_string(hide_password=False)


def run_pool(jobs: Sequence[Any], task: Callable, failed: Callable, workers: int, initializer: Callable,
             initargs: tuple, *, progress: bool = True, status: Callable | None = None,
             group: Callable[[Any], Hashable] | None = None) -> list:
    """``task(job)`` for every job in ``workers`` spawned processes; results in the order of ``jobs``.

    ``task``, ``failed`` and ``initializer`` must be module-level functions (the workers import them by name).
    A task that raises gets ``failed(job, "grading failed: …")``; a worker process that dies takes the jobs that
    were running to a fresh pool once (the pool holds no more jobs than workers: the others go on uncounted), and
    a job caught in two such crashes gets ``failed(job, why)`` too.

    ``group``: jobs of one group (a student's notebooks) go to one worker as far as the work allows
    (:class:`_Queue`), so that what a worker keeps for a group (a student's warm sandbox) serves all of them.
    """
    results: dict[int, Any] = {}
    crashes = dict.fromkeys(range(len(jobs)), 0)
    keys = [group(job) if group is not None else i for i, job in enumerate(jobs)]
    pending = list(range(len(jobs)))
    bar = tqdm(total=len(jobs), desc=f"grading ({workers} workers)", unit="notebook", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)

    def advance() -> None:
        if status is not None:
            bar.set_postfix_str(status(results.values()), refresh=False)
        bar.update(1)

    try:
        while pending:
            broken: list[int] = []
            queue = _Queue(pending, keys)
            # spawn, not fork: a fresh interpreter per worker, no copied locks, torch threads or open gradebooks
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(workers, mp_context=context, initializer=initializer,
                                     initargs=initargs) as pool:
                # as many jobs in the pool as workers: the one that frees a worker is the one that takes the next
                running: dict[Any, int] = {}
                for _ in range(workers):
                    if (i := queue.take(None)) is not None:
                        running[pool.submit(task, jobs[i])] = i
                while running:
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        i = running.pop(future)
                        try:
                            results[i] = future.result()
                        except BrokenProcessPool:
                            broken.append(i)
                            continue
                        except Exception as exc:  # the task reports its own failures; this is the machinery's
                            results[i] = failed(jobs[i], f"grading failed: {type(exc).__name__}: {exc}")
                        advance()
                        if not broken and (following := queue.take(keys[i])) is not None:
                            running[pool.submit(task, jobs[following])] = following
            pending = queue.left()  # never handed to this pool: no crash of theirs
            for i in sorted(broken):
                crashes[i] += 1
                if crashes[i] < 2:
                    pending.append(i)
                    continue
                results[i] = failed(jobs[i], "grading failed: a grading worker process died twice while grading "
                                             "this notebook; grade it again on its own")
                advance()
            pending.sort()
            if broken and pending:
                log.warning("a grading worker died; %d unfinished notebooks go to a fresh pool", len(pending))
    finally:
        bar.close()
    return [results[i] for i in range(len(jobs))]


class _Queue:
    """Which job a worker takes next: another of the group it just worked for (the same student), else the
    first of a group no worker has started, else the last job of the group with the most left (so that no
    worker idles while another has a long queue). Jobs of a group keep their order."""

    def __init__(self, indices: Sequence[int], keys: Sequence[Hashable]):
        self.groups: dict[Hashable, deque[int]] = {}
        for i in indices:
            self.groups.setdefault(keys[i], deque()).append(i)
        self.started: set[Hashable] = set()

    def take(self, key: Hashable | None) -> int | None:
        if key is not None and self.groups.get(key):
            return self.groups[key].popleft()
        for other, left in self.groups.items():
            if left and other not in self.started:
                self.started.add(other)
                return left.popleft()
        longest = max(self.groups.values(), key=len, default=None)
        return longest.pop() if longest else None

    def left(self) -> list[int]:
        return sorted(i for left in self.groups.values() for i in left)

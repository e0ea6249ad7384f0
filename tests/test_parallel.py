"""The grading pool (autograder.grading.pool.run_pool): results in the order of the jobs, a worker that dies costs its
running jobs one retry in a fresh pool, and a student's notebooks go to one worker as far as the work allows."""

from __future__ import annotations

import os
import time
from pathlib import Path

from autograder.grading import pool as parallel


def _init() -> None:
    pass


def _task(job: tuple[str, str, str]) -> tuple[str, int]:
    """(the job's name, the pid that ran it); a job named "die-once" kills its worker the first time, "die"
    every time."""
    group, name, flags = job
    if name == "die" or (name == "die-once" and not (flag := Path(flags) / "died").exists()):
        if name == "die-once":
            flag.touch()
        os._exit(1)
    if name.startswith("slow"):
        time.sleep(0.3)  # as long as a worker may take to start after the other: each then takes its own group
    return name, os.getpid()


def _failed(job, why: str) -> tuple[str, str]:
    return job[1], why


def _group(job) -> str:
    return job[0]


def test_the_queue_keeps_a_group_on_its_worker_and_steals_only_at_the_end():
    keys = ["a", "a", "a", "b", "b", "c"]
    queue = parallel._Queue(range(len(keys)), keys)
    assert [queue.take(None), queue.take(None)] == [0, 3]  # two workers start two groups
    assert queue.take("a") == 1 and queue.take("b") == 4  # each goes on with its own
    assert queue.take("b") == 5  # b is done: c, which nobody started
    assert queue.take("c") == 2  # nothing new left: the longest group's last job
    assert queue.take("a") is None and queue.left() == []


def test_a_worker_that_dies_costs_one_retry_and_twice_a_failure(tmp_path):
    jobs = [("s0", "ok0", str(tmp_path)), ("s0", "die-once", str(tmp_path)), ("s1", "ok1", str(tmp_path)),
            ("s1", "die", str(tmp_path)), ("s2", "ok2", str(tmp_path))]
    # one worker: a crash catches only the job that caused it (with two, the other worker's job is caught too)
    results = parallel.run_pool(jobs, _task, _failed, 1, _init, (), progress=False, group=_group)
    assert [name for name, _ in results] == ["ok0", "die-once", "ok1", "die", "ok2"], results
    assert isinstance(results[1][1], int), "the job whose worker died once was not graded in a fresh pool"
    assert "died twice" in results[3][1], results[3]


def test_a_groups_jobs_run_in_one_worker(tmp_path):
    jobs = [(f"s{i // 4}", f"slow{i}", str(tmp_path)) for i in range(16)]  # 4 students x 4 notebooks
    results = parallel.run_pool(jobs, _task, _failed, 2, _init, (), progress=False, group=_group)
    assert [name for name, _ in results] == [job[1] for job in jobs]
    pids = {}
    for (student, _, _), (_, pid) in zip(jobs, results, strict=True):
        pids.setdefault(student, set()).add(pid)
    # a student may be shared when a worker starts late or runs dry first: one at each end, at most
    assert sum(len(used) == 1 for used in pids.values()) >= 2, pids

"""The course's benchmarks: ``python -m bench`` (or ``./course bench``) prints one markdown table per section.

Sections (pick with ``--sections``; default all):
  notebooks   1. each solution notebook top to bottom in a fresh kernel (target ≤ 60 s each)
  grading     2. autograde cost per notebook: this pipeline vs plain nbgrader (bench/grading_overhead.py)
  class       3. a class of synthetic students x all released lessons: sequential vs 2 workers (target ≤ 30 min
              for 100 students; 10 are graded and the time scaled, unless --students says otherwise)
  training    4. lesson 07's toy task: seconds of CPU training to ≥ 99 % held-out exact match (target ≤ 60 s)
  kv-cache    5. lesson 09: KV-cache speed-up at 64/128/256 generated tokens, tokens identical (target ≥ 5×)
  attention   6. reference attention and decoder layer vs SDPA and nn.TransformerDecoderLayer (target ≤ 1.5×)
  dask        7. section 3's class on a Dask cluster of 2 workers on this machine vs local grading: the same
              grades.csv (a difference fails the section)
  guard       8. the run-time policy guard: a notebook's restricted items judged guarded vs unguarded, and the
              time to arm it (bench/policy_guard.py)
  report      9. the class report (./course report) for a synthetic class of 100 students x 13 lessons, built
              without grading (target ≤ 30 s on 2 cores)
  catch_rate 10. the corpus of realistic mistakes (autograder.course.mutants): the share the visible checks catch of
              what the hidden ones do, and the share costing exactly their own item (bench/catch_rate.py)

Medians of ``--repeats`` runs (3 by default); what is compared is timed in turn in the same run, so a busy
machine slows both sides. ``--quick`` is a smoke run: one repeat, a 2-student class, fewer sizes. These are not
tests: they never fail on a missed target, they say so in the table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

from bench.publish import SECTIONS  # noqa: E402 (the checkout on sys.path first)


def section(name: str, args) -> str:
    repeats = 1 if args.quick else args.repeats
    if name == "notebooks":
        from bench import notebooks

        return notebooks.run(args.quick, repeats)
    if name == "grading":
        # another engineer's module: run(quick, repeats) -> markdown, or main(argv) printing it
        try:
            module = importlib.import_module("bench.grading_overhead")
        except ModuleNotFoundError as exc:
            if exc.name != "bench.grading_overhead":
                raise
            return "not available yet (bench/grading_overhead.py does not exist)"
        if hasattr(module, "run"):
            return module.run(quick=args.quick, repeats=repeats)
        # its command-line entry point prints the markdown: take what it prints
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            module.main(["--repeats", str(repeats)])
        return printed.getvalue().strip()
    if name == "class":
        from bench import grading_class

        return grading_class.run(args.quick, args.students, args.workers)
    if name == "training":
        from bench import training

        return training.run(args.quick, repeats)
    if name == "kv-cache":
        from bench import kv_cache

        return kv_cache.run(args.quick, repeats)
    if name == "attention":
        from bench import attention

        return attention.run(args.quick, max(args.repeats, 7))
    if name == "dask":
        from bench import grading_dask

        return grading_dask.run(args.quick, args.students)
    if name == "guard":
        from bench import policy_guard

        return policy_guard.run(args.quick, repeats)
    if name == "report":
        from bench import report

        return report.run(args.quick, repeats)
    if name == "catch_rate":
        from bench import catch_rate

        return catch_rate.run(args.quick)
    raise ValueError(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS),
                        help="which sections to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: one repeat, smaller sizes")
    parser.add_argument("--repeats", type=int, default=3, help="repeats per measurement (median; default 3)")
    parser.add_argument("--students", type=int, default=None,
                        help="class size for sections 3 and 7 (default 10, quick 2; section 3 also scales it to 100)")
    parser.add_argument("--workers", type=int, default=2, help="workers for section 3 (default 2)")
    parser.add_argument("--output", type=Path, default=None, help="also write the markdown to this file")
    parser.add_argument("--publish", action="store_true",
                        help="merge this run's sections into the committed bench/results.json and regenerate the "
                             "README's block from it (every run is also kept in bench/results/latest.json)")
    args = parser.parse_args(argv)

    from bench.common import machine

    # nbgrader 0.9.6's gradebook code triggers SQLAlchemy autoflush notices; scores are unaffected
    warnings.filterwarnings("ignore", message=".*not in session.*")

    try:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    except ImportError:
        pass
    mode = "quick (one repeat, smaller sizes)" if args.quick else f"full, medians of {args.repeats} repeats"
    measured = machine()
    out = [f"Measured {measured}. Mode: {mode}."]
    print(out[0], flush=True)
    status = 0
    done: dict[str, tuple[str, str, float]] = {}
    for name in args.sections:
        started = time.perf_counter()
        try:
            body = section(name, args)
        except Exception:  # one broken section must not hide the others
            body = "failed:\n\n```\n" + traceback.format_exc(limit=5) + "```"
            status = 1
        took = time.perf_counter() - started
        text = f"\n### {SECTIONS[name]}\n\n{body}\n\n_(section took {took:.0f} s)_"
        print(text, flush=True)
        out.append(text)
        if not body.startswith("failed:"):
            done[name] = (SECTIONS[name], body, took)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text("\n".join(out) + "\n")
    from bench import publish

    record = publish.run_record(measured, mode, done)
    publish.write_latest(record)
    if args.publish:
        publish.publish(record)
        print(f"\npublished {', '.join(done) or 'nothing'} into {publish.RESULTS.relative_to(ROOT)} and README.md")
    return status


if __name__ == "__main__":
    sys.exit(main())

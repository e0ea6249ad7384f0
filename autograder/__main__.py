"""The instructor's entry point: ``python -m autograder COMMAND`` (or ``./course grade COMMAND``).

Commands
  build                      build solutions/<id>/<id>.ipynb from solutions/<id>.py and the references
  release                    build, then write the student release into lessons/ (nbgrader generate_assignment);
                             with a term (--term, term.toml), the lessons released by now into .grading/lessons,
                             earlier answers still open withheld (autograder/term/integrity.py)
  term                       the term's lessons: release, due, closing dates, extensions, what is open now
  grade SUBMISSIONS          canary, then every student in SUBMISSIONS (nbgrader's layout, or a Canvas, Moodle or
                             Gradescope export: --layout, else found from the files), feedback, grades.csv, roster.csv;
                             --scheduler tcp://HOST:PORT grades them on a Dask cluster; then the class report
  report [WORK]              the class report of a graded class (default .grading): WORK/report/index.html, items.csv,
                             mistakes.csv, students.csv, similarity.csv (autograder/pages/report.py)
  demo                       release, then grade three sample students (perfect, untouched, typical mistakes)
  student-edition DIR        the tree students get (lessons/, decoder_course, README, LICENSE, pyproject.toml);
                             --git makes it a git repository tagged v<version>, ready to push to the public repo;
                             --repository OWNER/NAME: the GitHub repository it goes to (badges, first cells, README)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import datetime
from pathlib import Path

from autograder.course import notebooks, samples
from autograder.grading import access, grade_class, pipeline
from autograder.grading import cluster as distributed
from autograder.grading import pool as parallel
from autograder.intake import submissions as intake
from autograder.term import integrity
from autograder.term import schedule as term
from decoder_course.text import shown


def _moment(text: str) -> datetime:
    """An ``--as-of`` time: ISO 8601, with an offset (without one: UTC)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: write 2027-02-01T09:00:00+01:00") from None


def _term_file(text: str) -> Path | str:
    """A ``--term`` file; ``--term ""`` says there is none, whatever $DECODER_COURSE_TERM or term.toml say
    (``Path("")`` would be the current folder)."""
    return text if text == "" else Path(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build solution notebooks from their sources")
    p_release = sub.add_parser("release", help="build the student release into lessons/")
    p_release.add_argument("--lessons", nargs="*", help="lesson ids (default: all; with a term, those released by "
                                                        "--as-of)")
    p_release.add_argument("--term", type=_term_file, default=None,
                           help="the term file (default: $DECODER_COURSE_TERM, or term.toml when there): a term's "
                                "release goes to .grading/lessons and withholds earlier answers still open")
    p_release.add_argument("--as-of", type=_moment, default=None, metavar="ISO-TIME",
                           help="the moment the release is made (default: now), e.g. 2027-02-01T09:00:00+01:00")
    p_release.add_argument("--out", type=Path, default=None, help="where the release goes")
    p_term = sub.add_parser("term", help="show the term: each lesson's release, due and closing dates")
    p_term.add_argument("--term", type=_term_file, default=None, help="the term file (default: $DECODER_COURSE_TERM, "
                                                                "or term.toml when there)")
    p_term.add_argument("--out", type=Path, default=None,
                        help="the term's release folder, beside which releases record when each lesson's answers went "
                             "out (default .grading/lessons)")
    p_report = sub.add_parser("report", help="write the class report of a graded class into WORK/report/")
    p_report.add_argument("work", type=Path, nargs="?", default=pipeline.WORK,
                          help="the grading folder (default .grading)")
    p_report.add_argument("--db-url", default=None, help="gradebook SQLAlchemy URL (default: SQLite in WORK)")
    p_edition = sub.add_parser("student-edition", help="write the student edition into a new folder")
    p_edition.add_argument("dest", type=Path, help="a new or empty folder")
    p_edition.add_argument("--git", action="store_true", help=f"make it a git repository tagged {notebooks.TAG}")
    p_edition.add_argument("--repository", default=notebooks.REPOSITORY, metavar="OWNER/NAME",
                           help="the GitHub repository you will publish it at: every lesson's Colab badge and first "
                                f"cell, and the README, point there (default {notebooks.REPOSITORY}, "
                                "autograder/course/notebooks.py's REPOSITORY)")
    for name in ("grade", "demo"):
        p = sub.add_parser(name)
        if name == "grade":
            p.add_argument("submissions", type=Path, help="folder student/lesson/*.ipynb, or an LMS zip export")
            p.add_argument("--layout", choices=intake.LAYOUTS, default=None,
                           help="the submissions' layout (default: found from the files): nbgrader's folders, flat "
                                "student_..._<lesson>.ipynb files, or a Canvas, Moodle or Gradescope export")
        p.add_argument("--work", type=Path, default=pipeline.ROOT / ".grading",
                       help="where nbgrader's trees, the gradebook, feedback and grades.csv go (default .grading)")
        p.add_argument("--db-url", default=None, help="gradebook SQLAlchemy URL (default: SQLite in --work)")
        p.add_argument("--lessons", nargs="*", help="lesson ids (default: the term's, else all)")
        p.add_argument("-v", "--verbose", action="store_true", help="show nbgrader's log")
        p.add_argument("--no-sandbox", action="store_true",
                       help="run student code without the bubblewrap sandbox (unsafe: it can read the solutions, "
                            "the gradebook and other students' work)")
        p.add_argument("--workers", type=int, default=parallel.default_workers(),
                       help="notebooks graded at once, one process each (default: one per core)")
        p.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                       help="grade on the Dask cluster of this scheduler (an address or a scheduler file), one "
                            "task per notebook; this process stays the gradebook's only writer "
                            "(docs/INSTRUCTOR.md, Grading on a cluster)")
        p.add_argument("--term", type=_term_file, default=None, metavar="FILE",
                       help=f"the term: due dates, late policy, extensions (default: ${term.ENV_VAR}, else term.toml "
                            "when there; without one nothing is late; term.example.toml shows one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    pipeline.quiet_nbgrader(getattr(args, "verbose", False))

    if args.command == "build":
        stale = notebooks.build_all()
        print(f"built {len(notebooks.lessons())} solution notebooks ({len(stale)} changed)")
        return 0
    if args.command == "student-edition":
        from autograder.term import edition

        try:
            written = edition.build(args.dest, git=args.git, repository=args.repository)
        except (ValueError, FileExistsError, FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"student edition {notebooks.TAG}: {len(written)} files in {args.dest}"
              + (f" (a git repository, tag {notebooks.TAG})" if args.git else ""))
        print(f"publish it at https://github.com/{args.repository} with that tag: the lessons' badges and "
              "first cells point there")
        return 0
    if args.command == "report":
        from autograder.pages import report

        try:
            page = report.write(args.work, args.db_url)
        except FileNotFoundError as exc:
            print(f"error: {shown(exc)}", file=sys.stderr)
            return 2
        print(f"class report: {page} (items.csv, mistakes.csv, students.csv, similarity.csv beside it); for the "
              "instructor only")
        return 0
    if args.command == "term":
        try:
            chosen = term.configured(args.term)
        except term.TermError as exc:
            print(f"error: {shown(exc, True)}", file=sys.stderr)
            return 2
        if chosen is None:
            print(f"no term: write term.toml (see term.example.toml), set ${term.ENV_VAR}, or pass --term")
            return 2
        try:
            print(integrity.schedule(chosen, term.now(), integrity.ledger_of(args.out or pipeline.TERM_RELEASE)))
        except term.TermError as exc:
            print(f"error: {shown(exc, True)}", file=sys.stderr)
            return 2
        return 0
    if args.command in ("release", "grade", "demo"):
        try:  # on a hub, nothing runs while students' accounts can read the solutions or the gradebook
            access.refuse_if_exposed(access.ROOT, getattr(args, "work", None), getattr(args, "db_url", None))
        except access.Exposed as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.command == "release":
        try:
            chosen = term.configured(args.term)
            out = args.out or (pipeline.TERM_RELEASE if chosen else pipeline.LESSONS_DIR)
            done = pipeline.release(args.lessons, out, term_file=chosen.path if chosen else "", as_of=args.as_of)
        except (term.TermError, pipeline.ReleaseRefused) as exc:
            print(f"error: {shown(exc, True)}", file=sys.stderr)
            return 2
        if chosen is None:
            print(f"released {len(done)} lessons into {out} (no term: the self-study edition, earlier lessons' "
                  "answers shown as given code; not for graded use)")
        else:
            print(f"released {', '.join(done)} into {out} for the term {chosen.path}, as of "
                  f"{term.shown_time(args.as_of or term.now(), chosen.zone)}")
            for warning in integrity.extensions_after_answers(chosen, integrity.ledger_of(out)):
                print(f"warning: {shown(warning)}")
        return 0

    started = time.perf_counter()
    try:  # before anything is released or graded: a term that cannot be used stops here, saying why
        term_file = pipeline.term_file_of(args.term)
        ledger = pipeline.handed_out_ledger(args.work)
        late_extensions = integrity.extensions_after_answers(term.load(term_file), ledger) if term_file else []
    except term.TermError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for warning in late_extensions:  # said before grading and again after the scores, where it is read
        print(f"warning: {shown(warning)}", file=sys.stderr)
    if args.command == "demo":
        pipeline.release(args.lessons)
        print(f"released {len(notebooks.lessons())} lessons into lessons/")
        submissions = samples.make_samples(args.work / "samples", args.lessons)
        print(f"sample submissions ({', '.join(samples.STUDENTS)}) in {submissions}")
    else:
        submissions = args.submissions
        if not submissions.exists():
            print(f"error: {submissions} does not exist; pass a folder student/lesson/*.ipynb or a zip",
                  file=sys.stderr)
            return 2
    try:
        outcomes = grade_class.grade(submissions, args.work, args.lessons, args.db_url, args.verbose,
                                  sandbox=not args.no_sandbox, workers=args.workers, progress=True,
                                  scheduler=args.scheduler, layout=getattr(args, "layout", None),
                                  term_file=term_file)
    except (pipeline.SandboxUnavailable, distributed.ClusterUnavailable, term.TermError,
            grade_class.NothingToGrade) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(pipeline.score_table(outcomes))
    bad = [o for o in outcomes if not o.ok]
    for o in bad:  # every part escaped: student, lesson and message may come from a student's files or kernel
        print(f"needs attention: {shown(o.student)}/{shown(o.lesson)}: {shown(o.message)}")
    print(f"\ngraded {len(outcomes) - len(set(o.lesson for o in outcomes))} notebooks "
          f"(+ canaries) in {time.perf_counter() - started:.0f} s; "
          f"grades: {args.work / 'grades.csv'} (who each id is: {args.work / 'roster.csv'}); "
          f"feedback: {args.work / 'feedback'}")
    if (args.work / "report" / "index.html").exists():
        print(f"class report (for you only: what the class got wrong, similar submissions): "
              f"{args.work / 'report' / 'index.html'}")
    print(pipeline.summary(outcomes))
    for warning in late_extensions:
        print(f"warning: {shown(warning)}")
    late = sum(1 for o in outcomes if o.late)
    print(f"term: {term_file}, {late} late notebook{'s' if late != 1 else ''} (penalties in grades.csv)" if term_file
          else f"no term (no ${term.ENV_VAR}, no term.toml, no --term): nothing is late")
    held = sorted({(o.lesson, o.feedback_held) for o in outcomes if o.feedback_held})
    for lesson, why in held:
        print(f"{lesson}: {why} (grading ran their answers in its given cells); grade again after then, or run "
              f"nbgrader generate_feedback {lesson}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

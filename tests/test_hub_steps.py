"""nbgrader's exchange steps say what they did (autograder/intake/hub_steps.py), built from the repository's config as
nbgrader's commands build them. The exchange cycle between real accounts (tests/test_exchange.py) reads the
success lines of release_assignment, collect and release_feedback; here: ``release_feedback`` with nothing to
release says why, feedback held until a time in the term's zone, or not graded yet."""

import logging
from datetime import UTC, datetime, timedelta

import pytest

from autograder.intake import hub_steps
from autograder.term import integrity
from autograder.term import schedule as term

LESSON = "02-attention"  # its given cells come from 01-masks: its feedback waits until 01-masks closes


def _release_feedback(tmp_path, monkeypatch, term_text: str | None):
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    from autograder.grading.pipeline import tools_config

    work, exchange = tmp_path / "work", tmp_path / "exchange"
    exchange.mkdir()
    monkeypatch.setenv("DECODER_COURSE_WORK", str(work))
    monkeypatch.setenv("NBGRADER_EXCHANGE_ROOT", str(exchange))
    if term_text is None:
        monkeypatch.setenv(term.ENV_VAR, "")
        monkeypatch.setattr(term, "DEFAULT", tmp_path / "no-term.toml")
    else:
        (tmp_path / "term.toml").write_text(term_text)
        monkeypatch.setenv(term.ENV_VAR, str(tmp_path / "term.toml"))
    config = tools_config(Config())
    assert config.ExchangeFactory.release_feedback is hub_steps.SayingReleaseFeedback
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = LESSON
    step = config.ExchangeFactory.release_feedback(coursedir=coursedir, authenticator=Authenticator(config=config),
                                                   config=config, log=logging.getLogger("autograder.tests"))
    step.start()


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York"])
def test_release_feedback_of_held_feedback_says_until_when(tmp_path, monkeypatch, capsys, zone):
    now = datetime.now(UTC).replace(microsecond=0)
    due = now + timedelta(days=2)
    text = (f'timezone = "{zone}"\n[late]\npercent_per_day = 10\ncutoff_days = 7\n[lessons]\n'
            f'"01-masks" = {{ release = {(now - timedelta(days=5)).isoformat()}, due = {due.isoformat()} }}\n'
            f'"02-attention" = {{ release = {now.isoformat()}, due = {(now + timedelta(days=9)).isoformat()} }}\n')
    _release_feedback(tmp_path, monkeypatch, text)
    said = capsys.readouterr().out
    loaded = term.load(tmp_path / "term.toml")
    until = integrity.feedback_held_until(loaded, LESSON, now)
    assert until == due + timedelta(days=7)
    assert f"released no feedback of {LESSON}: it is held until {term.shown_time(until, loaded.zone)}" in said
    assert " UTC)" in said and said.count("\n") == 1  # the term's clock with UTC beside, one line


def test_release_feedback_with_nothing_graded_says_so(tmp_path, monkeypatch, capsys):
    _release_feedback(tmp_path, monkeypatch, None)
    said = capsys.readouterr().out
    assert f"released no feedback of {LESSON}: there is none in " in said and "grade it first" in said

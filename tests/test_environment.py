"""One source of versions: pyproject.toml pins; environment.yml and the installed environment must agree."""

import re
import tomllib
from importlib import metadata

from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def _pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", requirement.strip())
        assert match, f"{requirement!r} is not an exact pin: the course environment pins every version"
        pins[match[1].lower()] = match[2]
    return pins


def _environment_yml_pins() -> dict[str, str]:
    text = (ROOT / "environment.yml").read_text()
    pins = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*-\s*([A-Za-z0-9_.-]+)==(\S+)\s*", line)
        if match:
            pins[match[1].lower()] = match[2]
    return pins


def test_environment_yml_has_exactly_the_student_pins():
    assert _environment_yml_pins() == _pins(EXTRAS["student"])


def test_environment_yml_python_matches_the_setup():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"-\s*python=3\.11\b", text), "environment.yml must ask for Python 3.11, as ./course does"


def test_grader_extras_stay_out_of_the_student_environment():
    student = _pins(EXTRAS["student"])
    assert "nbgrader" not in student, "nbgrader's extension shows students the instructor UI"
    assert "nbgrader" in _pins(EXTRAS["grader"])


def test_installed_versions_are_the_pinned_ones():
    pins = {**_pins(EXTRAS["student"]), **_pins(EXTRAS["grader"]), **_pins(EXTRAS["dev"])}
    wrong = {}
    for name, version in pins.items():
        installed = metadata.version(name)
        if installed.split("+")[0] != version:  # torch reports 2.13.0+cpu
            wrong[name] = (version, installed)
    assert not wrong, f"installed versions differ from the pins (rerun ./course setup): {wrong}"


def test_torch_is_pinned_where_the_setup_reads_it():
    assert _pins(EXTRAS["student"])["torch"] == "2.13.0"
    assert 'grep -o \'"torch==' in (ROOT / "course").read_text(), "./course installs torch from the pin first"

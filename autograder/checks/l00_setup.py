"""Hidden checks of lesson 00-setup: the specs of ``decoder_course.visible.l00_setup`` on secret draws, against the
reference's values (``autograder.checks.spec``)."""

from autograder.checks import spec
from autograder.reference import setup as ref
from decoder_course.visible.l00_setup import SPECS

spec.register("00-setup", SPECS, ref)

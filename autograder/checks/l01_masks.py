"""Hidden checks of lesson 01-masks: the specs of ``decoder_course.visible.l01_masks`` on secret draws, against the
reference's values (``autograder.checks.spec``)."""

from autograder.checks import spec
from autograder.reference import masks as ref
from decoder_course.visible.l01_masks import SPECS

spec.register("01-masks", SPECS, ref)

"""Compatibility name: a hub's nbgrader config written before the rooms names the course's collect by this path
(``autograder.exchange.CourseExchangeCollect``). It lives in :mod:`autograder.intake.exchange`; name that path in
new configs."""

from autograder.intake.exchange import CourseExchangeCollect

__all__ = ["CourseExchangeCollect"]

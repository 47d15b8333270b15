"""StepShape moved to stages.step_shape (the core lays it out); this name stays for code
written against the old place."""

from stages.step_shape import StepShape

__all__ = ["StepShape"]

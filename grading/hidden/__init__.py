"""Hidden checks: graded by staff, left out of the student release."""

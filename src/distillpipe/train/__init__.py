"""Training: the student-agnostic loop, schedules and checkpoints."""

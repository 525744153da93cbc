"""Measuring real servers: open-loop load generation (and, next, validate)."""

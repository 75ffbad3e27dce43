"""Discrete-event timeline of one training step: compute and communication streams, shared links,
pipeline schedules. Refines the closed form for the plans that matter and draws the step as a trace."""

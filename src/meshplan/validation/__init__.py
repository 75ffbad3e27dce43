"""Validation against published training runs, and calibration of the compute model on them."""

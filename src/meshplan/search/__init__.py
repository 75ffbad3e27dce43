"""Enumerate plans, evaluate them, rank them, and find where the best plan changes."""

"""Pure cost functions: (specs, plan) -> numbers. No I/O, no printing, no torch."""

"""The PyTorch harness: a reference model built from a ModelSpec, and cross-checks of meshplan's
predictions (parameters, FLOPs, every collective, model-state memory) against what PyTorch does.

Needs the ``torch`` extra. This package's ``__init__`` and ``crosscheck_cli`` never import torch; the
other modules do, and only the harness commands and the tests in ``tests/torch`` import them.
"""

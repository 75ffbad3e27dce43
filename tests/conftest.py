import importlib.util

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None
requires_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs the torch extra (pip install torch==2.13.0)")

"""``meshplan measure``: measure GEMM throughput, collective bandwidth and a real training step.

Modules that never import torch: ``shapes`` (the GEMM shapes a plan runs), ``fit`` (the alpha-beta
least-squares fit of a collective sweep), ``trace`` (exposed communication from a profiler trace),
``profile_io`` (the ``meshplan.profile/1`` file: build, merge, check, write), ``compare``
(predicted against measured) and ``launch`` (start the ranks under torchrun, stop them, report the
failed one). ``rank`` (what each rank runs) and the measuring modules ``timing``, ``dist``, ``gemm``,
``collectives`` and ``step`` import torch and run under ``torchrun`` (see docs/measure.md).
"""

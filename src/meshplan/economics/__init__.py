"""Time to train, GPU-hours, cost, energy and goodput of a predicted plan (pure Python, no dependency).

``summarise(estimate, model, cluster, job)`` turns one estimated plan into a ``Summary`` for the job's
token budget: failure-free and effective training time, GPU-hours, cost at a price per GPU-hour, energy from
board power and PUE, and goodput (expected interruptions from a published failure rate, checkpoint write
time from the checkpoint's bytes and the storage bandwidth, Daly's optimal checkpoint interval, restart
and lost work), each time-proportional figure with the prediction's band. ``defaults_for(cluster)`` gives
the catalog's dated, sourced assumptions (``catalog/economics.toml``); ``Settings.override`` replaces any.
The formulas are in ``economics.formulas``; docs/time-cost-goodput.md has the method and sources.
"""

from meshplan.economics.settings import Settings, defaults_for, failure_rate, failure_rates
from meshplan.economics.summary import Banded, Goodput, Summary, checkpoint_bytes, goodput, summarise
from meshplan.economics.text import summary_lines

__all__ = ["Banded", "Goodput", "Settings", "Summary", "checkpoint_bytes", "defaults_for", "failure_rate",
           "failure_rates", "goodput", "summarise", "summary_lines"]

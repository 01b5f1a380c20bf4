"""Beam counters of the ``beam_upsert`` namespace, in one place."""

from apache_beam.metrics import Metrics

NAMESPACE = "beam_upsert"

COUNTER_NAMES = (
    "inserts",
    "updates",
    "deletes",
    "dropped_before_resume",
    "late_applied",
    "stale_dropped",
    "invalid",
    "rehydrated",
)


class UpsertCounters:
    """The counters one DoFn instance reports to."""

    def __init__(self) -> None:
        for name in COUNTER_NAMES:
            setattr(self, name, Metrics.counter(NAMESPACE, name))

    def count_step(self, old, new) -> None:
        if old is None:
            self.inserts.inc()
        elif new is None:
            self.deletes.inc()
        else:
            self.updates.inc()

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
        # Entries a key keeps in the stateful flavor after a firing: its live
        # value (0 or 1) plus its pending commands.
        self.state_entries = Metrics.distribution(NAMESPACE, "state_entries")

    def add_steps(self, tally) -> None:
        """Adds a ``[inserts, updates, deletes]`` tally (see beam_upsert.emit)."""
        for counter, n in zip((self.inserts, self.updates, self.deletes), tally):
            if n:
                counter.inc(n)

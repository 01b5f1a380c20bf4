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
    "too_late",
    "invalid",
    "rehydrated",
)


class UpsertCounters:
    """The counters one DoFn instance reports to."""

    def __init__(self) -> None:
        for name in COUNTER_NAMES:
            setattr(self, name, Metrics.counter(NAMESPACE, name))
        # What a shard keeps in the stateful flavor after a firing: entries
        # (live values, tombstones, snapshot values not yet applied, pending
        # commands) and bytes.
        self.state_entries = Metrics.distribution(NAMESPACE, "state_entries")
        self.state_bytes = Metrics.distribution(NAMESPACE, "state_bytes")

    def add_steps(self, tally) -> None:
        """Adds a ``[inserts, updates, deletes]`` tally (see beam_upsert.emit)."""
        for counter, n in zip((self.inserts, self.updates, self.deletes), tally):
            if n:
                counter.inc(n)

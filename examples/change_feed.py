"""Keep an embedding table in step with a document table by its change feed.

Run ``python -m examples.change_feed`` (or ``python examples/change_feed.py``)
from the repository root. It works in a fresh temporary directory, printed
first and removed at the end, unless ``--dir`` names one to keep, and prints
what each sync did.

A keyed table of documents changes (new, edited and deleted documents). A sync
reads its changes since the version the last sync reached with
``ReadChangesFromSupertable`` and applies them to an embedding table with
``UpsertToSupertable``: an inserted row is embedded and upserted, a retraction
with no insertion of its key at that version deletes the key's embedding. Only
the documents that changed are embedded again.

The sync is exactly-once without coordination: the commands carry the commit
time of the document version as their time, and ``UpsertToSupertable`` drops
commands below the embedding table's frontier. So a sync that crashed after
its commit, before it recorded how far it got, redoes nothing when rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import pyarrow as pa

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from beam_supertable import Supertable  # noqa: E402 - imports no Beam
from beam_supertable.jobs._launch import quiet_logging  # noqa: E402 - imports no Beam
from examples.rag_pipeline import DIM, embed  # noqa: E402 - a stand-in embedding model

DOCUMENTS = pa.schema([("doc", pa.string()), ("body", pa.string())])
EMBEDDINGS = pa.schema([("doc", pa.string()), ("body", pa.string()),
                        ("embedding", pa.list_(pa.float32(), DIM))])


def sync(documents: str, embeddings: str, position: str) -> dict:
    """Applies the document changes since the recorded position; returns what it did."""
    import apache_beam as beam
    from apache_beam.metrics import Metrics
    from apache_beam.metrics.metric import MetricsFilter

    from beam_supertable import ReadChangesFromSupertable, UpsertToSupertable
    from beam_upsert import UpsertCommand

    start = json.load(open(position))["version"] if os.path.exists(position) else 0
    end = Supertable.open(documents).version
    if start == end:
        return {"from": start, "to": end, "embedded": 0, "deleted": 0}

    class ToCommand(beam.DoFn):
        """A change -> an upsert command at the change's time: an insertion embeds
        (offset 1), a retraction deletes (offset 0: an insertion of the key at the
        same version wins)."""

        def setup(self):
            self._embedded = Metrics.counter("change_feed", "embedded")

        def process(self, change, at=beam.DoFn.TimestampParam):
            from apache_beam.transforms.window import TimestampedValue
            if change.diff > 0:
                self._embedded.inc()
                row = {**change.value, "embedding": embed(change.value["body"])}
                yield TimestampedValue(UpsertCommand(change.key, row, 1), at)
            else:
                yield TimestampedValue(UpsertCommand(change.key, None, 0), at)

    p = beam.Pipeline()
    _ = (p | ReadChangesFromSupertable(documents, start_version=start, end_version=end)
         | beam.ParDo(ToCommand())
         | UpsertToSupertable(embeddings, schema=EMBEDDINGS, primary_key="doc",
                              vector_column="embedding", metric="cosine"))
    result = p.run()
    result.wait_until_finish()
    embedded = sum(c.committed or c.attempted or 0 for c in result.metrics().query(
        MetricsFilter().with_name("embedded"))["counters"])
    deletes = sum(c.committed or c.attempted or 0 for c in result.metrics().query(
        MetricsFilter().with_name("deletes"))["counters"])
    with open(position, "w") as f:
        json.dump({"version": end}, f)
    return {"from": start, "to": end, "embedded": embedded, "deleted": deletes}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where the two tables go, kept (default: a new "
                                      "temporary directory, removed at the end)")
    args = parser.parse_args(argv)
    quiet_logging()   # Beam's import-time messages, as the jobs hide them
    if args.dir:
        print(f"tables in {args.dir}")
        _run(args.dir)
        return
    with tempfile.TemporaryDirectory(prefix="change-feed-") as where:
        print(f"tables in {where} (removed at the end; --dir DIR keeps them)")
        _run(where)


def _run(where: str) -> None:
    documents = os.path.join(where, "documents")
    embeddings = os.path.join(where, "embeddings")
    position = os.path.join(where, "position.json")
    docs = Supertable.create(documents, DOCUMENTS, primary_key="doc", mode="exist_ok")

    docs.upsert(pa.table({"doc": ["cats", "bread", "tides", "rockets"], "body": [
        "Cats sleep most of the day and groom their fur.",
        "Bread dough rises because yeast makes gas.",
        "Tides rise and fall because the moon pulls on the oceans.",
        "A rocket carries fuel and oxidizer to burn in space."]}, schema=DOCUMENTS))
    _report(sync(documents, embeddings, position), embeddings)

    docs.upsert(pa.table({"doc": ["bread", "volcanoes"], "body": [
        "Sourdough bread rises with a starter of wild yeast.",
        "Volcanoes erupt when magma rises through the crust."]}, schema=DOCUMENTS))
    docs.delete(pa.compute.field("doc") == "rockets")
    _report(sync(documents, embeddings, position), embeddings)
    _report(sync(documents, embeddings, position), embeddings)   # nothing new: nothing done

    hit = Supertable.open(embeddings).search(vector=embed("sourdough starter yeast"), k=1)
    print(f"nearest to 'sourdough starter yeast': {hit['doc'][0].as_py()}")


def _report(done: dict, embeddings: str) -> None:
    table = Supertable.open(embeddings)
    docs = sorted(table.to_arrow(columns=["doc"])["doc"].to_pylist())
    print(f"sync of document versions {done['from']}..{done['to']}: embedded "
          f"{done['embedded']}, deleted {done['deleted']}; embeddings of {docs}")


if __name__ == "__main__":
    main()

"""Checks that Iceberg readers (pyiceberg) read every version of a table as it holds it."""

from __future__ import annotations

import pytest

from beam_supertable import Supertable


FSSPEC_IO = "pyiceberg.io.fsspec.FsspecFileIO"


def iceberg_properties(storage_options):
    """pyiceberg's FileIO properties for a table's store (its own names for each)."""
    if not storage_options:
        return {}
    if "client_kwargs" in storage_options:   # S3 and S3-compatible servers
        return {"s3.endpoint": storage_options["client_kwargs"]["endpoint_url"],
                "s3.access-key-id": storage_options["key"],
                "s3.secret-access-key": storage_options["secret"], "s3.region": "us-east-1"}
    if "connection_string" in storage_options:   # Azure (Azurite)
        return {"py-io-impl": FSSPEC_IO,
                "adls.connection-string": storage_options["connection_string"],
                "adls.account-name": storage_options["account_name"]}
    if "endpoint_url" in storage_options:   # Google Cloud Storage (fake-gcs-server)
        return {"py-io-impl": FSSPEC_IO, "gcs.service.host": storage_options["endpoint_url"],
                "gcs.oauth2.token": "anon", "gcs.project-id": storage_options.get("project", "")}
    raise ValueError(f"no pyiceberg properties for {sorted(storage_options)}")


def rows_of(table) -> list:
    """Rows as plain tuples sorted by ``_id``: fixed-size and plain lists compare alike."""
    columns = table.to_pydict()
    names = sorted(columns, key=lambda c: (c != "_id", c))
    return sorted(zip(*(columns[c] for c in names)))


def iceberg_scan(location, storage_options=None, snapshot_id=None, **scan):
    static = pytest.importorskip("pyiceberg.table").StaticTable
    table = static.from_metadata(location, iceberg_properties(storage_options))
    return table.scan(snapshot_id=snapshot_id, **scan)


def assert_every_version_reads_alike(uri, storage_options=None, every=1):
    """pyiceberg's scan of snapshot N, from version N's metadata and by id from the latest
    one, holds the rows of ``Supertable.open(uri, version=N).to_arrow()``; with ``every``
    above 1, for every ``every``-th version and the latest (a long history on a slow
    store)."""
    from beam_supertable.iceberg.metadata import SNAPSHOTS_KEPT
    latest = Supertable.open(uri, storage_options=storage_options)
    oldest = min(v["version"] for v in latest.history())
    latest_location = latest.iceberg_metadata_location()
    static = pytest.importorskip("pyiceberg.table").StaticTable
    listed = [s.snapshot_id for s in static.from_metadata(
        latest_location, iceberg_properties(storage_options)).metadata.snapshots]
    # The newest versions, up to SNAPSHOTS_KEPT, in order: the history has no gap.
    expected = list(range(max(oldest, 1, latest.version - SNAPSHOTS_KEPT + 1),
                          latest.version + 1))
    assert listed == expected, (f"snapshots listed by the latest metadata: {listed[:5]}..."
                                f"{listed[-3:]} ({len(listed)}), expected {expected[:3]}..."
                                f"{expected[-3:]} ({len(expected)})")
    for version in sorted(set(range(oldest, latest.version + 1, every)) | {latest.version}):
        ours = rows_of(Supertable.open(uri, version=version,
                                       storage_options=storage_options).to_arrow())
        location = latest.iceberg_metadata_location(version)
        assert rows_of(iceberg_scan(location, storage_options).to_arrow()) == ours, version
        if version in listed:
            by_id = iceberg_scan(latest_location, storage_options, snapshot_id=version)
            assert rows_of(by_id.to_arrow()) == ours, f"snapshot {version} by id"

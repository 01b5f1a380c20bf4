"""A secret in ``storage_options`` stays there: it reaches no log, message, display
data, transform repr, store object, ``inspect`` output or dead letter, on every server."""

from __future__ import annotations

import copy
import json
import logging
import pickle
import subprocess
import sys

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from apache_beam.transforms.display import DisplayData

from beam_supertable import Supertable, WriteToSupertable, inspect_table
from beam_supertable.format.store import ObjectStore
from tests import store_servers

MARKER = "Sekr3tMarker-0f9e8d7c"
SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string())])


def _with_marker(uri: str, options: dict):
    """The options with the marker where the backend keeps a secret (and still works)."""
    options = copy.deepcopy(options)
    if "client_kwargs" in options:             # S3 servers here check no signature
        options["secret"] = MARKER
        return options, MARKER
    if "connection_string" in options:         # Azurite checks the account key: it is the secret
        return options, store_servers.AZURITE_KEY
    options["project"] = MARKER                # the GCS emulator takes an anonymous token
    return options, MARKER


def _leaks(text: str, secret: str) -> bool:
    return secret in text


def test_a_secret_in_storage_options_appears_nowhere(remote_location, caplog, tmp_path):
    uri, base = remote_location
    options, secret = _with_marker(uri, base)
    caplog.set_level(logging.DEBUG)
    Supertable.create(uri, SCHEMA, storage_options=options)
    write = WriteToSupertable(uri, schema=SCHEMA, storage_options=options).with_invalid_output()
    # Display data, and the transform's repr before and after pickling.
    shown = [str(item.value) for item in DisplayData.create_from(write).items]
    assert not any(_leaks(s, secret) for s in shown), shown
    assert not _leaks(repr(write), secret)
    assert not _leaks(repr(pickle.loads(pickle.dumps(write))), secret)
    def one_dead_letter_without_the_secret(letters):
        # Dead letters carry the row and the reason, not the settings.
        assert len(letters) == 1 and "id" in letters[0], letters
        assert not _leaks(letters[0], secret), letters

    with TestPipeline() as p:
        rows = p | beam.Create([{"id": 1, "body": "a"}, {"id": "not an int", "body": "b"}])
        result = rows | write
        assert_that(result.invalid | beam.Map(str), one_dead_letter_without_the_secret)
    table = Supertable.open(uri, storage_options=options)
    assert table.count_rows() == 1
    assert not _leaks(repr(table.store), secret)
    table.sync_iceberg()
    # What the table wrote to the store: versions, parts, Iceberg metadata.
    store = ObjectStore(uri, options)
    for info in store.list(""):
        data = store.get(info.path)
        assert secret.encode() not in data, info.path
    # inspect, through the API and the command line.
    assert not _leaks(json.dumps(inspect_table(uri, storage_options=options), default=str),
                      secret)
    done = subprocess.run([sys.executable, "-m", "beam_supertable", "inspect", "--table", uri,
                           "--storage-options", json.dumps(options), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not _leaks(done.stdout + done.stderr, secret)
    # Errors: a table that is not there, and a request the store refuses.
    with pytest.raises(Exception) as missing:
        Supertable.open(uri + "-missing", storage_options=options)
    assert not _leaks(str(missing.value), secret)
    done = subprocess.run([sys.executable, "-m", "beam_supertable", "inspect", "--table",
                           uri + "-missing", "--storage-options", json.dumps(options)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and not _leaks(done.stdout + done.stderr, secret)
    # Logs at every level, ours and the client libraries'.
    assert not _leaks(caplog.text, secret)

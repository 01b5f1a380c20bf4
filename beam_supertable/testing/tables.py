"""Throwaway tables, and matchers for tables and changelogs (``beam_supertable.testing``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import fsspec
import pyarrow as pa

from beam_supertable.errors import SupertableError
from beam_supertable.format.schema import ID
from beam_supertable.format.store import ObjectStore
from beam_supertable.iceberg.metadata import settle
from beam_supertable.table.supertable import Supertable
from beam_supertable.testing.diff import (
    DEFAULT_ABS_TOL, DEFAULT_REL_TOL, RowDiff, change_parts, changelog_diff, has_float, plain)

__all__ = ["assert_table_rows", "changelog_equals", "table_rows_equal", "temporary_table"]

WHERE = ("memory", "local")
MEMORY_ROOT = "memory://beam-supertable-testing"


# -- a throwaway table -------------------------------------------------------------------
@contextlib.contextmanager
def temporary_table(schema: Optional[pa.Schema] = None, *,
                    primary_key: Union[str, Sequence[str], None] = None,
                    vector_column: Optional[str] = None, where: str = "memory",
                    dir: Union[str, os.PathLike, None] = None,  # noqa: A002 - as tempfile's
                    **create_options: Any) -> Iterator[str]:
    """A table location of its own for one test, removed on exit.

    With ``schema`` the table is created empty (``Supertable.create`` with
    ``primary_key``, ``vector_column`` and ``create_options``: ``metric``,
    ``fts_columns``, ``n_cells`` and so on); without, nothing is there yet
    and a transform that creates tables (``UpsertToSupertable`` with
    ``schema`` and ``primary_key``, ``WriteToSupertable``) creates it.

    Example::

        with temporary_table(schema, primary_key="id") as uri:
            with TestPipeline() as p:
                commits = p | beam.Create(rows) | WriteToSupertable(uri)
                assert_that(commits, table_rows_equal(uri, rows))

    A pytest fixture is two lines::

        @pytest.fixture
        def table_uri():
            with temporary_table() as uri:
                yield uri

    Args:
        schema: the user columns of a table to create, or None to create none.
        where: ``"memory"``: a unique ``memory://`` path. It lives in this
            process only: right for the DirectRunner running in-process (the
            default), not for one that runs workers in other processes
            (``direct_running_mode="multi_processing"``) or for Flink.
            ``"local"``: a new temporary directory on local disk, which every
            process of this machine sees (a multi-process DirectRunner, a
            local Flink cluster).
        dir: where ``"local"`` makes its directory (``tempfile``'s default
            when None), e.g. pytest's ``tmp_path``.

    Yields:
        The table's URI.

    Raises:
        ValueError: an unknown ``where``, or table settings without a schema.
    """
    if where not in WHERE:
        raise ValueError(f"temporary_table: where must be one of {WHERE}, got {where!r}")
    if schema is None and (primary_key is not None or vector_column is not None
                           or create_options):
        raise ValueError("temporary_table: primary_key, vector_column and other table "
                         "settings need a schema (without one, no table is created)")
    if where == "memory":
        if dir is not None:
            raise ValueError("temporary_table: dir is for where='local'")
        uri = f"{MEMORY_ROOT}/{uuid.uuid4().hex}"
        cleanup = _remove_memory
    else:
        folder = tempfile.mkdtemp(prefix="supertable-", dir=None if dir is None else os.fspath(dir))
        uri = os.path.join(folder, "table")
        cleanup = lambda _: shutil.rmtree(folder, ignore_errors=True)  # noqa: E731
    try:
        if schema is not None:
            Supertable.create(uri, schema, primary_key=primary_key, vector_column=vector_column,
                              **create_options)
        yield uri
    finally:
        # What this process committed has its Iceberg metadata still being
        # written: removing the table under the writer would let it write again.
        settle(ObjectStore(uri))
        cleanup(uri)


def _remove_memory(uri: str) -> None:
    fs = fsspec.filesystem("memory")
    if fs.exists(uri):
        fs.rm(uri, recursive=True)


# -- table rows ----------------------------------------------------------------------
def _key_names(key: Union[str, Sequence[str], None]) -> List[str]:
    if key is None:
        return []
    return [key] if isinstance(key, str) else list(key)


class _TableRows:
    """Compares a table's live rows with expected ones; see :func:`table_rows_equal`."""

    def __init__(self, uri: str, expected: Iterable[Mapping[str, Any]], *,
                 version: Optional[int], columns: Optional[Sequence[str]],
                 key: Union[str, Sequence[str], None], ordered: bool,
                 storage_options: Optional[dict], rel_tol: float, abs_tol: float,
                 where: str) -> None:
        self.uri = uri
        self.version = version
        self.key = _key_names(key)
        self.ordered = ordered
        self.storage_options = storage_options
        self.rel_tol, self.abs_tol = rel_tol, abs_tol
        self.where = where
        rows = list(expected)
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise ValueError(f"{where}: expected row {i} must be a dict of columns, got "
                                 f"{type(row).__name__} {row!r}")
        self.columns = list(columns) if columns is not None else (
            list(rows[0]) if rows else None)
        if self.columns is not None:
            if ID in self.columns:
                raise ValueError(f"{where}: {ID!r} is the hidden row id, never compared")
            for i, row in enumerate(rows):
                lacks = [c for c in self.columns if c not in row]
                extra = [c for c in row if c not in self.columns]
                if lacks or extra:
                    raise ValueError(
                        f"{where}: expected row {i} "
                        + (f"lacks column(s) {lacks}" if lacks else "")
                        + (" and " if lacks and extra else "")
                        + (f"has column(s) {extra} not among {self.columns}" if extra else "")
                        + " (every expected row names the compared columns)")
            missing_key = [c for c in self.key if c not in self.columns]
            if missing_key:
                raise ValueError(f"{where}: key column(s) {missing_key} are not among the "
                                 f"compared columns {self.columns}")
        self.expected = [{c: plain(v) for c, v in row.items()} for row in rows]

    def message(self) -> Optional[str]:
        """The failure message, or None when the table holds the expected rows."""
        at = "latest version" if self.version is None else f"version {self.version}"
        try:
            table = Supertable.open(self.uri, self.version,
                                    storage_options=self.storage_options)
        except (SupertableError, FileNotFoundError) as exc:
            return f"{self.where}: cannot open {self.uri} at the {at}: {exc}"
        names = self.columns if self.columns is not None else table.user_schema.names
        unknown = [c for c in names if c not in table.user_schema.names]
        if unknown:
            return (f"{self.where}: {self.uri} (version {table.version}) has no column(s) "
                    f"{unknown}; its columns are {table.user_schema.names}")
        actual = table.to_arrow(columns=names).to_pylist() if names else []
        approx = [c for c in names if has_float(table.schema.field(c).type)]
        diff = RowDiff(names, approx, self.key, self.ordered, self.rel_tol, self.abs_tol)
        found = diff(self.expected, actual)
        if found is None:
            return None
        return (f"{self.where}: {self.uri} at version {table.version} ({at}) differs from "
                f"the expected rows ({len(self.expected)} expected, {len(actual)} in the "
                f"table; columns {names}):\n{found}")

    def __call__(self, actual: Any = None) -> None:
        # What assert_that hands over (the write's commits) only orders this
        # check after the write; the table itself is what is compared.
        from apache_beam.testing.util import BeamAssertException

        found = self.message()
        if found is not None:
            raise BeamAssertException(found)


def table_rows_equal(uri: str, expected_rows: Iterable[Mapping[str, Any]], *,
                     version: Optional[int] = None, columns: Optional[Sequence[str]] = None,
                     key: Union[str, Sequence[str], None] = None, ordered: bool = False,
                     storage_options: Optional[dict] = None,
                     rel_tol: float = DEFAULT_REL_TOL,
                     abs_tol: float = DEFAULT_ABS_TOL) -> _TableRows:
    """An ``assert_that`` matcher: the table at ``uri`` holds ``expected_rows``.

    The matcher ignores the elements it is given and opens the table when it
    runs, so apply it to the PCollection that the write outputs (its commit
    results): ``assert_that`` runs a matcher once that PCollection is
    complete, which is after the last commit. Applied to the input of the
    write, it could run before the write commits.

    Example::

        commits = rows | WriteToSupertable(uri, schema=schema)
        assert_that(commits, table_rows_equal(uri, [{"id": 1, "emb": [0.1, 0.2]}]))

    Rows are compared as a multiset (order ignored) over ``columns``; the
    hidden ``_id`` column never is. Floats, vectors included (as lists),
    compare with ``math.isclose`` tolerances; NaN equals NaN. A failure
    lists the missing and the unexpected rows, or with ``key`` the missing,
    unexpected and changed keys, column by column.

    Args:
        uri: the table.
        expected_rows: dicts of column values (vectors as lists or numpy arrays).
        version: the version to read; the latest when None.
        columns: the compared columns; by default the columns the expected
            rows name (all the table's columns when there are none).
        key: column(s) that pair expected and actual rows, for a diff by key.
        ordered: compare in the order the table returns its rows.
        storage_options: fsspec options of the store.
        rel_tol, abs_tol: the float tolerance.

    Raises:
        ValueError: at once, for an expected row that is not a dict or does
            not name the compared columns (naming the row and column).
    """
    return _TableRows(uri, expected_rows, version=version, columns=columns, key=key,
                      ordered=ordered, storage_options=storage_options, rel_tol=rel_tol,
                      abs_tol=abs_tol, where="table_rows_equal")


def assert_table_rows(uri: str, expected_rows: Iterable[Mapping[str, Any]], *,
                      version: Optional[int] = None, columns: Optional[Sequence[str]] = None,
                      key: Union[str, Sequence[str], None] = None, ordered: bool = False,
                      storage_options: Optional[dict] = None,
                      rel_tol: float = DEFAULT_REL_TOL,
                      abs_tol: float = DEFAULT_ABS_TOL) -> None:
    """Asserts that the table at ``uri`` holds ``expected_rows``, outside a pipeline.

    For use after ``with TestPipeline() as p:`` has ended (the pipeline has
    run). The comparison and the arguments are :func:`table_rows_equal`'s.

    Raises:
        AssertionError: the table differs, with the diff.
        ValueError: a malformed expected row.
    """
    found = _TableRows(uri, expected_rows, version=version, columns=columns, key=key,
                       ordered=ordered, storage_options=storage_options, rel_tol=rel_tol,
                       abs_tol=abs_tol, where="assert_table_rows").message()
    if found is not None:
        raise AssertionError(found)


# -- changelogs ----------------------------------------------------------------------
class _Changelog:
    """Compares a changelog with the expected changes; see :func:`changelog_equals`."""

    def __init__(self, expected: Iterable[Any], consolidate: bool) -> None:
        self.expected = list(expected)
        for i, element in enumerate(self.expected):
            change_parts(element, f"changelog_equals: expected element {i}")
        self.consolidate = consolidate

    def __call__(self, actual: Iterable[Any]) -> None:
        from apache_beam.testing.util import BeamAssertException

        found = changelog_diff(self.expected, list(actual), consolidate=self.consolidate)
        if found is not None:
            raise BeamAssertException(f"changelog_equals: {found}")


def changelog_equals(expected_changes: Iterable[Any], *, consolidate: bool = True) -> _Changelog:
    """An ``assert_that`` matcher for a ``beam_upsert`` changelog.

    Beam's ``equal_to`` compares elements one by one. This matcher compares
    a changelog by what it means: per ``(key, value)``, the net diff (a +1
    and a -1 of one value cancel, so a retraction that a later firing undoes
    does not fail the test), and reports the difference key by key.

    Example::

        changes = commands | Upsert()
        assert_that(changes, changelog_equals([Change("k", "b", +1)]))

    Elements are ``Change(key, value, diff)`` or tuples ``(key, value, diff,
    ...)``; fields after ``diff`` (an event time a test added, say) take
    part in the comparison as part of the value.

    Args:
        expected_changes: the expected changes.
        consolidate: compare net diffs (the default); False compares how many
            times each ``(key, value, diff)`` occurs, retractions included.

    Raises:
        ValueError: at once, for an expected element that is not a change.
    """
    return _Changelog(expected_changes, consolidate)

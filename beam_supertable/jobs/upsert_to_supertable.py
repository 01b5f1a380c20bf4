"""Templated batch job: upsert commands -> a keyed supertable, the loop closed.

Reads upsert commands, reads the table's live rows back as the prior and its
frontier as the resume point, and applies the commands above the frontier as
ONE commit (replaced and deleted rows get deletion vectors, new values go in
as superfiles) that records the new frontier. Run it again on the same
commands and it changes nothing.

A command is ``{"key": ..., "offset": ..., "time": ..., "value": {...} | null}``
(JSON lines, or Parquet with the same columns, ``value`` a struct): ``time``
is seconds since the epoch or an ISO-8601 string, ``value`` the row (its key
column(s) may be left out: they are filled from ``key``; a composite key is
a JSON list), null deletes the key. ``{"error": "..."}`` in place of a value
(a value that failed to decode) is a dead letter.

Rejected commands go to the dead letters (``--dead-letters``), each record
``{"element": <the command>, "reason": ..., "run": ..., "version": ...}``;
every run appends its own. To apply corrected commands that lie below the
frontier by now, fix their ``element`` and pass the records to ``--replay``:
they are applied as of the table's current frontier, except for a key whose
row changed after the run that rejected the command (its row in the version
the record names differs from its row now): that key keeps its newer row and
the command goes back to the dead letters, saying so.

Run ``python -m pipelines.upsert_to_supertable --help`` (installed:
``beam-supertable-upsert --help``) for the options. With no arguments it
applies the sample ``commands.jsonl`` shipped in ``beam_supertable/jobs/samples``
to the table ``out/sensors`` (created on the first run, keyed by ``key``).
"""


from __future__ import annotations

import difflib
import json
import os
import tempfile
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_supertable import Supertable, UpsertToSupertable
from beam_supertable._program import program_name
from beam_supertable.format.row_reasons import row_problem
from beam_supertable.jobs.file_rows import (
    BAD_TAG, INFER_SAMPLE_ROWS, dead_letter, format_of, open_text, parse_schema)
from beam_supertable.jobs.io_formats import (
    JOB_NAMESPACE, command_row, parse_key, parse_time, to_json)
from beam_supertable.jobs.options import (
    DeadLetters, JobError, JobParser, add_dead_letters, add_max_invalid, add_schema_mode,
    add_storage_options, check_invalid, counter_totals, default_dead_letters, input_format,
    job_argv, local_parents, new_run_id, open_table, parse, require_input, run_pipeline,
    schema_difference, split_columns, storage_options)
from beam_supertable.jobs.options import main as job_main
from beam_supertable.transforms.upsert_write import NAMESPACE as TABLE_NAMESPACE
from beam_upsert import Invalid, UpsertCommand
from beam_upsert.metrics import NAMESPACE as UPSERT_NAMESPACE

__all__ = ["build_parser", "infer_schema", "main", "run"]

PROG = program_name("python -m pipelines.upsert_to_supertable")
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")
DEFAULT_COMMANDS = os.path.join(SAMPLES, "commands.jsonl")
DEFAULT_TABLE = os.path.join("out", "sensors")
DEFAULT_PRIMARY_KEY = "key"
JOB = "upsert_to_supertable"


def build_parser() -> JobParser:
    parser = JobParser(PROG, __doc__)
    parser.add_argument(
        "--commands", default=None, metavar="PATH",
        help="upsert commands: JSON lines or Parquet (a file or a glob). Default: the sample "
             "commands.jsonl")
    parser.add_argument(
        "--table", default=DEFAULT_TABLE, metavar="URI",
        help="the keyed supertable (a local path, memory://..., s3://...); created when absent")
    parser.add_argument(
        "--primary-key", "--primary_key", dest="primary_key", default=None, metavar="COLUMNS",
        help="key column(s) of a new table, comma-separated, naming columns of the values "
             f"(the default {DEFAULT_PRIMARY_KEY!r} may be left out of them: it is filled from "
             "each command's key); an existing table's key when absent")
    parser.add_argument(
        "--schema", default=None, metavar="COLUMNS",
        help="columns of a new table, e.g. 'key:string,reading:int64,emb:float32[8]'. "
             "Default: inferred from the values in the first command file")
    parser.add_argument(
        "--vector-column", "--vector_column", dest="vector_column", default=None,
        metavar="COLUMN", help="column to vector-index when creating the table")
    parser.add_argument(
        "--text-columns", "--text_columns", dest="text_columns", default=None,
        metavar="COLUMNS", help="comma-separated string columns to text-index when creating "
                                "the table")
    add_storage_options(parser)
    parser.add_argument(
        "--job-id", "--job_id", dest="job_id", default=None, metavar="ID",
        help="names the job's commits and its dead letters. Default: one id per run")
    add_schema_mode(parser)
    add_dead_letters(parser, JOB)
    add_max_invalid(parser, "commands")
    parser.add_argument(
        "--replay", default=None, metavar="PATH",
        help="apply corrected dead-letter records (this job's, their element fixed) as of the "
             "table's current frontier instead of --commands; a key whose row changed since "
             "the rejecting run keeps it")
    return parser


def with_key(value: dict, key: Any, names: List[str]) -> dict:
    """The row with its key column(s) filled from the command's key where absent."""
    parts = key if len(names) > 1 and isinstance(key, tuple) else (key,)
    row = dict(value)
    for name, part in zip(names, parts):
        row.setdefault(name, part)
    return row


class ParseTableCommand(beam.DoFn):
    """A JSON line or Parquet row -> a timestamped ``UpsertCommand(key, row | None, offset)``."""

    def __init__(self, primary_key: List[str]) -> None:
        self._names = primary_key

    def setup(self):
        self._read = Metrics.counter(JOB_NAMESPACE, "commands_read")

    def process(self, element):
        self._read.inc()
        try:
            row = command_row(element)
            if row.get("error") is not None:
                raise ValueError(f"it carries an error instead of a value: {row['error']}")
            key, value = parse_key(row["key"]), row.get("value")
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"value must be an object or null, got "
                                 f"{type(value).__name__}")
            if isinstance(value, dict):
                value = with_key(value, key, self._names)
            yield TimestampedValue(UpsertCommand(key, value, row["offset"]),
                                   parse_time(row["time"]))
        except (TypeError, ValueError) as exc:
            yield dead_letter(element, f"unusable command: {exc}")


def command_id(key: Any, offset: Any) -> str:
    """A command's key and offset as one string (a replayed command's record is found by it)."""
    return json.dumps([list(key) if isinstance(key, tuple) else key, offset], default=str)


class _AsCommandRecord(beam.DoFn):
    """A refused command -> ``Invalid`` whose element is the command as the input writes it,
    so it can be corrected and given to ``--replay``; a replayed command's is the record's
    own element (``originals``, by :func:`command_id`), so it keeps its shape."""

    def __init__(self, originals: Optional[Dict[str, dict]] = None) -> None:
        self._originals = originals or {}

    def process(self, invalid, timestamp=beam.DoFn.TimestampParam):
        element = invalid.element
        if isinstance(element, UpsertCommand) or (
                isinstance(element, tuple) and len(element) == 3):
            key, value, offset = element
            original = self._originals.get(command_id(key, offset))
            element = original if original is not None else {"key": list(key) if isinstance(key, tuple) else key, "value": value,
                       "offset": offset, "time": Timestamp.of(timestamp).to_rfc3339()}
        yield Invalid(element, invalid.reason)


def _read(p, pattern: str, fmt: str):
    if fmt == "parquet":
        return p | "ReadParquet" >> beam.io.ReadFromParquet(pattern)
    if fmt != "jsonl":
        raise JobError(f"--commands {pattern}: expected JSON lines or Parquet, got {fmt}")
    return p | "ReadJson" >> beam.io.ReadFromText(pattern)


def sample_commands(path: str) -> List[dict]:
    """Up to ``INFER_SAMPLE_ROWS`` commands of the file at ``path`` (unreadable lines skipped)."""
    if format_of(path) == "parquet":
        try:
            return pq.ParquetFile(path).read_row_group(0).slice(0, INFER_SAMPLE_ROWS).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            # (pyarrow's message names no file: "Parquet magic bytes not found".)
            raise JobError(f"--commands {path}: not a readable Parquet file ({exc})") from None
    rows = []
    with open_text(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue   # a dead letter when the job reads it
            if isinstance(row, dict):
                rows.append(row)
            if len(rows) >= INFER_SAMPLE_ROWS:
                break
    return rows


def _values(rows: List[dict]) -> List[tuple]:
    """(key, value) of the sampled commands that carry a value."""
    return [(parse_key(r["key"]), r["value"]) for r in rows
            if isinstance(r.get("value"), dict) and "key" in r]


def infer_schema(pattern: str, primary_key: List[str],
                 vector_column: Optional[str] = None) -> pa.Schema:
    """The table schema from the values of the first command file.

    Raises:
        JobError: no usable values, or a column whose type cannot be
            inferred; the message suggests ``--schema``.
    """
    path = require_input("--commands", pattern)
    values = [with_key(v, k, primary_key) for k, v in _values(sample_commands(path))]
    if not values:
        raise JobError(f"--commands {path}: no command with a value to infer the table's "
                       "columns from; pass --schema")
    names = list(dict.fromkeys(primary_key + [k for v in values for k in v]))
    fields = []
    for name in names:
        try:
            typ = pa.array([v.get(name) for v in values]).type
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise JobError(f"--commands {path}: cannot infer one type for column {name!r} "
                           f"({exc}); pass --schema") from None
        if name == vector_column:
            first = next((v[name] for v in values if v.get(name)), None)
            if not isinstance(first, list):
                raise JobError(f"--vector-column {name}: the commands hold no list in it; "
                               "pass --schema with a float32[DIM] column")
            typ = pa.list_(pa.float32(), len(first))
        fields.append(pa.field(name, pa.string() if pa.types.is_null(typ) else typ))
    return pa.schema(fields)


# -- checks before anything is written ------------------------------------------------------------
def _closest(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(path: str, keys: List[str], rows: List[dict], *, new_table: bool) -> None:
    """The key columns against the sampled commands' values.

    Raises:
        JobError: a key column no value holds (except the default ``key``, which
            is filled from each command's key), or values whose key column never
            agrees with the command's key (the key names a column of another
            meaning).
    """
    values = _values(rows)
    if not values:
        return
    seen = {name for _, v in values for name in v}
    if new_table and keys != [DEFAULT_PRIMARY_KEY]:
        missing = [k for k in keys if k not in seen]
        if missing:
            raise JobError(f"--primary-key {','.join(keys)}: the commands' values have no "
                           f"column {missing[0]!r}{_closest(missing[0], sorted(seen))}; their "
                           f"columns are {sorted(seen)}")
    carrying = [(k, v) for k, v in values if all(name in v for name in keys)]
    if not carrying:
        return

    def agrees(key, value) -> bool:
        parts = key if len(keys) > 1 and isinstance(key, tuple) else (key,)
        return len(parts) == len(keys) and all(value[n] == p for n, p in zip(keys, parts))

    if not any(agrees(k, v) for k, v in carrying):
        key, value = carrying[0]
        held = ", ".join(f"{n}={value[n]!r}" for n in keys)
        raise JobError(f"--primary-key {','.join(keys)}: no command's value agrees with its "
                       f"key in {path} (the first: key {key!r}, value {held}); the key "
                       "column(s) must hold the command's key")


def check_columns(flag: str, path: str, schema: pa.Schema, rows: List[dict]) -> None:
    """Raises JobError when most sampled values hold a column ``schema`` lacks."""
    values = [v for _, v in _values(rows)]
    counts: Dict[str, int] = {}
    for v in values:
        for name in v:
            counts[name] = counts.get(name, 0) + 1
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if name not in schema.names and 2 * n >= len(values):
            raise JobError(f"{flag}: the values in {path} hold column {name!r}, which the "
                           f"{'schema' if flag == '--schema' else 'table'} lacks"
                           f"{_closest(name, schema.names)}; its columns are {schema.names}")


def check_values(flag: str, path: str, schema: pa.Schema, keys: List[str], rows: List[dict],
                 vector_column: Optional[str]) -> None:
    """Raises JobError when none of the sampled values fits the new table's schema.

    A wrong type in ``--schema`` (or a vector of another dimension) would
    otherwise create the table, reject every value and record a frontier past
    them, so that no rerun could apply them.
    """
    values = [with_key(v, k, keys) for k, v in _values(rows)]
    if not values:
        return
    problems = [row_problem(v, schema, vector_column) for v in values]
    if all(problems):
        raise JobError(f"{flag}: no value in {path} fits the new table's columns (the first: "
                       f"{problems[0]}); nothing was written")


class Plan(NamedTuple):
    """What the job reads and writes, settled (and checked) before the pipeline is built."""

    pattern: Optional[str]   # None until a replay has written its command file
    keys: List[str]
    schema: Optional[pa.Schema]
    create: Dict[str, Any]     # UpsertToSupertable's create settings; {} for an existing table
    options: Optional[dict]


def plan(args) -> Plan:
    options = storage_options(args)
    table = open_table("--table", args.table, options)
    given_keys = split_columns(args.primary_key)
    schema = None
    if args.schema:
        try:
            schema = parse_schema(args.schema)
        except ValueError as exc:
            raise JobError(str(exc)) from None
    if args.replay and args.commands:
        raise JobError("--replay and --commands: give one of them")
    if args.replay and table is None:
        raise JobError(f"--replay: no table at {args.table}; a replay applies dead letters to "
                       "the table that rejected them")
    if table is not None:
        keys = table.primary_key
        if not keys:
            raise JobError(f"--table {args.table}: the table has no primary key, and an upsert "
                           "needs one; name a new table (it is created keyed), or write this "
                           "one with load_supertable")
        if given_keys and given_keys != keys:
            raise JobError(f"--primary-key {args.primary_key}: the table at {args.table} is "
                           f"keyed by {','.join(keys)}")
        merge = getattr(args, "schema_mode", "strict") == "merge"
        differs = (schema_difference(schema, table.user_schema)
                   if schema is not None and not merge else None)
        if differs:
            raise JobError(f"--schema does not match the table at {args.table}: {differs}")
        if args.replay:   # the records are checked one by one (prepare_replay)
            return Plan(None, keys, schema, {}, options)
    pattern = args.commands or DEFAULT_COMMANDS
    path = require_input("--commands", pattern)
    input_format("--commands", path)
    rows = sample_commands(path)
    if table is not None:
        check_keys(path, keys, rows, new_table=False)
        if not merge:   # --schema-mode merge: new columns join the table
            check_columns("--table " + args.table, path, table.user_schema, rows)
        return Plan(pattern, keys, schema, {}, options)
    keys = given_keys or [DEFAULT_PRIMARY_KEY]
    check_keys(path, keys, rows, new_table=True)
    if schema is None:
        schema = infer_schema(pattern, keys, args.vector_column)
    else:
        missing = [k for k in keys if k not in schema.names]
        if missing:
            raise JobError(f"--primary-key {','.join(keys)}: --schema has no column "
                           f"{missing[0]!r}{_closest(missing[0], schema.names)}")
        check_columns("--schema", path, schema, rows)
    text = split_columns(args.text_columns)
    for column in text:
        if column in schema.names and not pa.types.is_string(schema.field(column).type) \
                and not pa.types.is_large_string(schema.field(column).type):
            raise JobError(f"--text-columns {column}: a text index needs a string column; "
                           f"{column!r} is {schema.field(column).type}")
    for flag, column in [("--vector-column", args.vector_column)] + [
            ("--text-columns", c) for c in text]:
        if column and column not in schema.names:
            raise JobError(f"{flag} {column}: not a column of the table"
                           f"{_closest(column, schema.names)}; its columns are {schema.names}")
    check_values("--schema" if args.schema else "--commands", path, schema, keys, rows,
                 args.vector_column)
    return Plan(pattern, keys, schema, {"vector_column": args.vector_column,
                                        "fts_columns": tuple(text)}, options)


# -- replay ---------------------------------------------------------------------------------------
def _key_filter(keys: List[str], key_values: List[Any]) -> pc.Expression:
    if len(keys) == 1:
        return pc.field(keys[0]).isin(key_values)
    expr = None
    for kv in key_values:
        clause = None
        for name, part in zip(keys, kv):
            c = pc.field(name) == part
            clause = c if clause is None else clause & c
        expr = clause if expr is None else expr | clause
    return expr


def _rows_by_key(table: Supertable, keys: List[str], key_values: List[Any]) -> Dict[Any, dict]:
    names = table.user_schema.names
    rows = table.to_arrow(columns=names, filter=_key_filter(keys, key_values)).to_pylist()
    return {(tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]): r for r in rows}


class Replay(NamedTuple):
    pattern: Optional[str]     # the commands to apply, re-timed; None: none
    refused: List[Invalid]     # records not replayed, with the reason
    landed: int                # records an earlier replay already applied
    originals: Dict[str, dict]  # each replayed record's element, by command_id


def _landed(schema: pa.Schema, keys: List[str], key: Any, command: dict,
            row: Optional[dict]) -> bool:
    """Whether the key's row now is what ``command`` makes it (an earlier replay landed)."""
    value = command.get("value")
    if value is None or row is None:
        return value is None and row is None
    try:
        want = pa.Table.from_pylist([with_key(value, key, keys)], schema=schema).to_pylist()[0]
    except (pa.ArrowException, TypeError, ValueError, AttributeError):
        return False
    return want == row


def prepare_replay(args, table_plan: Plan, folder: str) -> Replay:
    """The replayable commands of ``--replay``, as a command file in ``folder``: each
    re-timed to the table's frontier, per key the highest offset. A record whose
    command an earlier replay applied already is skipped (and counted)."""
    table = open_table("--table", args.table, table_plan.options, must_exist=True)
    if table.frontier is None:
        raise JobError(f"--replay: the table at {args.table} has no frontier yet; apply the "
                       "commands with --commands")
    path = require_input("--replay", args.replay)
    keys, refused = table_plan.keys, []
    latest: Dict[Any, tuple] = {}
    with open_text(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                element, version = record["element"], record["version"]
                command = command_row(element)
                key = parse_key(command["key"])
                if not isinstance(version, int):
                    raise ValueError("its version is not an integer")
            except (KeyError, TypeError, ValueError) as exc:
                reason = (f"missing field {exc}" if isinstance(exc, KeyError) else str(exc))
                refused.append(Invalid(line.rstrip("\n"), f"--replay {path} line {number}: not "
                                       f"a dead-letter record of this job ({reason})"))
                continue
            held = latest.get(key)
            if held is None:
                latest[key] = (command, version)
                continue
            # Two records for one key: the highest offset wins (the upsert's rule),
            # the later record on a tie; the other is said not replayed.
            try:
                newer = command["offset"] >= held[0]["offset"]
            except TypeError:
                newer = True
            loser = held[0] if newer else command
            if newer:
                latest[key] = (command, version)
            refused.append(Invalid(loser, f"not replayed: --replay {path} holds another "
                                          f"record for key {key!r} with a higher offset "
                                          f"(the highest offset wins)"))
    if not latest:
        return Replay(None, refused, 0, {})
    now = _rows_by_key(table, keys, list(latest))
    by_version: Dict[int, List[Any]] = {}
    for key, (_, version) in latest.items():
        by_version.setdefault(version, []).append(key)
    then: Dict[Any, dict] = {}
    for version, version_keys in by_version.items():
        try:
            old = Supertable.open(args.table, version=version,
                                  storage_options=table_plan.options)
        except FileNotFoundError:
            raise JobError(f"--replay: version {version} of {args.table} (the version the "
                           "rejecting run left) is gone, vacuumed; cannot tell which keys "
                           "changed since") from None
        then.update({k: v for k, v in _rows_by_key(old, keys, version_keys).items()
                     if k in version_keys})
    at = Timestamp(micros=table.frontier).to_rfc3339()
    out = os.path.join(folder, "replay.jsonl")
    landed, originals = 0, {}
    with open(out, "w", encoding="utf-8") as f:
        for key, (command, version) in latest.items():
            if now.get(key) != then.get(key) and _landed(
                    table.user_schema, keys, key, command, now.get(key)):
                landed += 1
                continue
            if now.get(key) != then.get(key):
                refused.append(Invalid(command, f"not replayed: key {key!r} changed after "
                                       f"version {version} (the version the rejecting run "
                                       "left); it keeps its newer row"))
                continue
            originals[command_id(key, command["offset"])] = command
            f.write(json.dumps({**command, "time": at}, default=str) + "\n")
    return Replay(out, refused, landed, originals)


# -- the pipeline ---------------------------------------------------------------------------------
def build(p: beam.Pipeline, args, todo: Plan, part: str, refused: Sequence[Invalid] = (),
          originals: Optional[Dict[str, dict]] = None) -> None:
    parsed = (_read(p, todo.pattern, format_of(todo.pattern))
              | "Parse" >> beam.ParDo(ParseTableCommand(todo.keys)).with_outputs(
                  BAD_TAG, main="ok"))
    written = parsed.ok | "Upsert" >> UpsertToSupertable(
        args.table, schema=todo.schema, primary_key=todo.keys, storage_options=todo.options,
        job_id=args.job_id, schema_mode=getattr(args, "schema_mode", "strict"),
        **todo.create).with_invalid_output()
    bad = [parsed[BAD_TAG], written.invalid | "AsCommand" >> beam.ParDo(_AsCommandRecord(originals))]
    if refused:
        bad.append(p | "NotReplayed" >> beam.Create(list(refused)))
    _ = (tuple(bad) | "AllBad" >> beam.Flatten()
         | "DeadLetterJson" >> beam.Map(to_json)
         | "WriteDeadLetters" >> beam.io.WriteToText(part, shard_name_template="",
                                                     num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (UPSERT_NAMESPACE, TABLE_NAMESPACE, JOB_NAMESPACE))


def run(argv: Optional[List[str]] = None) -> dict:
    """Runs the job; returns its counters (RejectedRun past ``--max-invalid``)."""
    options, args = parse(build_parser(), job_argv(argv))
    todo = plan(args)
    dead = DeadLetters(default_dead_letters(args.table, args.dead_letters, JOB),
                       new_run_id(args.job_id))
    local_parents(args.table, dead.part)
    replay = Replay(None, [], 0, {})
    with tempfile.TemporaryDirectory() as folder:
        if args.replay:
            replay = prepare_replay(args, todo, folder)
            pattern = replay.pattern
            if pattern is None:   # nothing replayable: the records go back as dead letters
                pattern = os.path.join(folder, "none.jsonl")
                open(pattern, "w").close()
            todo = todo._replace(pattern=pattern)
        result = run_pipeline(options, build, args, todo, dead.part, replay.refused,
                              replay.originals)
    refused = replay.refused
    counts = summarize(result)
    table = Supertable.open(args.table, storage_options=todo.options)
    counts["version"], counts["frontier"] = table.version, table.frontier
    counts["dropped"] = counts.get("dropped_before_resume", 0)
    counts["invalid"] = (counts.get("invalid", 0) + counts.get("unparseable", 0)
                         + len(refused))
    dead.finish(version=table.version)
    replayed = (f" replayed={counts.get('commands_read', 0) - counts['invalid'] + len(refused)}"
                f" not_replayed={len(refused)} already_applied={replay.landed}"
                if args.replay else "")
    print(
        f"upsert_to_supertable: inserts={counts.get('inserts', 0)} "
        f"updates={counts.get('updates', 0)} deletes={counts.get('deletes', 0)} "
        f"dropped={counts['dropped']} invalid={counts['invalid']}{replayed} "
        f"frontier={counts['frontier']} version={counts['version']} -> {args.table} "
        f"(dead letters: {dead.path})", flush=True)
    check_invalid(PROG, counts["invalid"],
                  counts.get("commands_read", 0) + len(refused) + replay.landed,
                  args.max_invalid)
    return counts


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pipelines.upsert_to_supertable``: runs the job; returns the exit status."""
    return job_main(run, argv, PROG)


if __name__ == "__main__":
    raise SystemExit(main())

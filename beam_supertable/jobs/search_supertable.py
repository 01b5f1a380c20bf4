"""Templated batch job: a file of queries -> the top-k rows of a supertable for each.

A query is a row with ``id``, ``text`` and/or ``vector`` (or ``embedding``):
JSON lines, Parquet or CSV (a vector cell as a JSON array). Each query is
answered by ``SupertableSearchEnrichmentHandler``, the table's handler for
Beam's Enrichment: vector, text (BM25) or hybrid search, with --k, --filter
and --columns. One output line per query::

    {"id": "q1", "text": "...", "mode": "hybrid",
     "results": [{"id": "c7", "distance": 0.031, "content": "...", "_score": ...}, ...]}

where ``distance`` is the vector distance (smaller is closer) for vector
queries and the score (larger is better) for text and hybrid ones. Every
query reads the table's version of when the job starts. Malformed queries go
to ``<output>.invalid.jsonl`` with the reason.

Run ``python -m pipelines.search_supertable --help`` for the options. With no
arguments it answers the sample ``queries.jsonl`` from ``out/chunks`` (the table
``python -m pipelines.load_supertable`` loads by default).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from typing import Any, List, NamedTuple, Optional

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from beam_supertable._program import program_name
from beam_supertable.jobs.file_rows import (
    BAD_TAG, FORMATS, dead_letter, finite_vector, read_rows)
from beam_supertable.jobs.io_formats import JOB_NAMESPACE, to_json
from beam_supertable.jobs.options import (
    DeadLetters, JobError, JobParser, add_max_invalid, add_storage_options, check_invalid,
    counter_totals, input_format, job_argv, local_parents, new_run_id, open_table, parse, positive_int,
    output_file, require_input, run_pipeline, storage_options)
from beam_supertable.jobs.options import main as job_main
from beam_supertable.rag import (
    DEFAULT_MAX_BATCH_SIZE, ENRICHMENT_KEY, MODES, EnrichWithSupertable,
    SupertableSearchEnrichmentHandler)

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples")
PROG = program_name("python -m pipelines.search_supertable")
DEFAULT_QUERIES = os.path.join(SAMPLES, "queries.jsonl")
DEFAULT_TABLE = os.path.join("out", "chunks")
DEFAULT_OUTPUT = os.path.join("out", "search_results.jsonl")
DEFAULT_K = 3

_LITERAL = r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false'
_CLAUSE = re.compile(rf"\s*(\w+)\s*(==|!=|>=|<=|>|<)\s*({_LITERAL})\s*", re.IGNORECASE)
_AND = re.compile(r"and\s", re.IGNORECASE)
_OPS = {"==": "__eq__", "!=": "__ne__", ">=": "__ge__", "<=": "__le__", ">": "__gt__",
        "<": "__lt__"}


def _literal(raw: str) -> Any:
    if raw[0] in "\"'":
        return json.loads(raw) if raw[0] == '"' else raw[1:-1]
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return float(raw) if re.search(r"[.eE]", raw) else int(raw)


def _kind(typ: pa.DataType) -> Optional[str]:
    """What literals a column of ``typ`` compares with; None: not checked here."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "string"
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return "number"
    if pa.types.is_boolean(typ):
        return "bool"
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ) or pa.types.is_binary(typ) \
            or pa.types.is_large_binary(typ):
        return "none"   # no literal of the syntax compares with these
    if (pa.types.is_list(typ) or pa.types.is_fixed_size_list(typ)
            or pa.types.is_large_list(typ) or pa.types.is_struct(typ)):
        return "none"
    return None


_LITERAL_TYPES = {str: ("string", "string"), bool: ("bool", "bool"), int: ("number", "int64"),
                  float: ("number", "float64")}


def filter_type_problem(text: str, schema: pa.Schema) -> Optional[str]:
    """The first clause of a ``--filter`` whose literal cannot be compared with its column,
    as one line naming the column and both types; None when every clause can."""
    from beam_supertable.format.row_reasons import type_name
    for m in _CLAUSE.finditer(text):
        column, _, raw = m.groups()
        if column not in schema.names:
            continue
        typ = schema.field(column).type
        kind = _kind(typ)
        value = _literal(raw)
        value_kind, value_type = _LITERAL_TYPES[type(value)]
        if kind is not None and kind != value_kind:
            return (f"--filter: column {column!r} is {type_name(typ)}, the value {raw} is "
                    f"{value_type}; they cannot be compared"
                    + (" (quote a string: " + f'{column} == "{raw}")' if kind == "string" else ""))
    return None


def parse_filter(text: str) -> pc.Expression:
    """``'topic == "space" and year >= 2010'`` -> a pyarrow expression.

    Clauses ``column op literal`` (op: == != < <= > >=; literal: a number, a
    quoted string, true or false) joined by ``and``.
    """
    pos, expr = 0, None
    while True:
        m = _CLAUSE.match(text, pos)
        if not m:
            raise ValueError(f"--filter: cannot read {text[pos:]!r}; expected clauses like "
                             "year >= 2010 or topic == \"space\", joined by and")
        column, op, raw = m.groups()
        value = _literal(raw)
        clause = getattr(pc.field(column), _OPS[op])(value)
        expr = clause if expr is None else expr & clause
        pos = m.end()
        if pos == len(text):
            return expr
        more = _AND.match(text, pos)
        if not more:
            raise ValueError(f"--filter: expected 'and' before {text[pos:]!r}")
        pos = more.end()


def checked_filter(text: str, schema: pa.Schema) -> pc.Expression:
    """``parse_filter(text)`` with every clause's column in ``schema`` and comparable
    with its literal; ValueError (one line starting ``--filter:``) otherwise."""
    expr = parse_filter(text)
    names = schema.names
    for column in filter_columns(text):
        if column not in names:
            close = difflib.get_close_matches(column, names, n=1)
            raise ValueError(f"--filter: the table has no column {column!r}"
                             + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; its columns are {names}")
    problem = filter_type_problem(text, schema)
    if problem:
        raise ValueError(problem)
    return expr


def build_parser() -> JobParser:
    parser = JobParser(PROG, __doc__)
    parser.add_argument(
        "--queries", default=None, metavar="PATH",
        help="queries (a path or a glob): JSON lines, Parquet or CSV rows with id, text "
             "and/or vector. Default: the sample queries.jsonl")
    parser.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                        help="format of the queries; auto: by extension")
    parser.add_argument("--table", default=DEFAULT_TABLE, metavar="URI",
                        help="the supertable to search")
    parser.add_argument(
        "--output", default=DEFAULT_OUTPUT, metavar="PATH",
        help="results, one JSON line per query; malformed queries are appended to "
             "<output>.invalid.jsonl")
    parser.add_argument("--k", type=positive_int, default=DEFAULT_K, metavar="N",
                        help="results per query")
    parser.add_argument(
        "--mode", choices=MODES, default="auto",
        help="vector, text, hybrid, or auto: each query by what it carries, both -> hybrid")
    parser.add_argument(
        "--filter", default=None, metavar="EXPR",
        help="rows must pass, e.g. 'topic == \"space\" and year >= 2010'")
    parser.add_argument(
        "--columns", default=None, metavar="COLUMNS",
        help="comma-separated columns to return. Default: all but the vector")
    parser.add_argument("--nprobe", type=positive_int, default=None, metavar="N",
                        help="vector cells probed per query. Default: the table's")
    parser.add_argument(
        "--batch-size", "--batch_size", dest="batch_size", type=positive_int,
        default=DEFAULT_MAX_BATCH_SIZE, metavar="N", help="most queries per search call")
    add_storage_options(parser)
    add_max_invalid(parser, "queries")
    return parser


def invalid_path(output: str) -> str:
    return output + ".invalid.jsonl"


class _ToRequest(beam.DoFn):
    """A query row -> ``beam.Row(id, text, embedding)`` the handler answers, or a dead letter."""

    def __init__(self, dim: Optional[int], text_index: bool, mode: str):
        self._dim, self._text_index, self._mode = dim, text_index, mode

    def process(self, row):
        try:
            yield self._request(row)
        except (TypeError, ValueError) as exc:
            yield dead_letter(row, f"query {row.get('id')!r}: {exc}")

    def _request(self, row) -> beam.Row:
        qid = row.get("id")
        text = row.get("text")
        vector = row.get("vector", row.get("embedding"))
        if isinstance(vector, str):  # a CSV cell
            vector = json.loads(vector) if vector.strip() else None
        if text is not None and not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        has_text = bool(text and text.strip())
        if vector is not None:
            if self._dim is None:
                raise ValueError("the table has no vector index")
            vector = finite_vector(vector, self._dim)
        needs_vector = self._mode in ("vector", "hybrid")
        needs_text = self._mode in ("text", "hybrid")
        if needs_vector and vector is None:
            raise ValueError(f"{self._mode} search needs a vector")
        if needs_text and not has_text:
            raise ValueError(f"{self._mode} search needs text")
        if vector is None and not has_text:
            raise ValueError("a query needs text, a vector or both")
        if has_text and self._mode != "vector" and not self._text_index:
            raise ValueError("the table has no text index")
        return beam.Row(id=qid, text=text if has_text else None, embedding=vector)


class _ToOutput(beam.DoFn):
    def __init__(self, mode: str):
        self._mode = mode

    def setup(self):
        self._queries = Metrics.counter(JOB_NAMESPACE, "queries")
        self._results = Metrics.counter(JOB_NAMESPACE, "results")
        self._empty = Metrics.counter(JOB_NAMESPACE, "empty_results")

    def process(self, row):
        data = getattr(row, ENRICHMENT_KEY)
        mode = self._mode
        if mode == "auto":
            mode = ("hybrid" if row.text else "vector") if row.embedding is not None else "text"
        results = [{**fields, "id": rid, "distance": distance}
                   for rid, distance, fields in zip(data["id"], data["distance"], data["fields"])]
        self._queries.inc()
        self._results.inc(len(results))
        if not results:
            self._empty.inc()
        yield {"id": row.id, "text": row.text, "mode": mode, "results": results}


def filter_columns(text: str) -> List[str]:
    """The columns a ``--filter`` names, in order."""
    return list(dict.fromkeys(m.group(1) for m in _CLAUSE.finditer(text)))


class Plan(NamedTuple):
    """The table's version and what the queries need of it, checked before the pipeline."""

    queries: str
    format: str
    handler: SupertableSearchEnrichmentHandler
    dim: Optional[int]
    text_index: bool


def plan(args) -> Plan:
    options = storage_options(args)
    queries = args.queries or DEFAULT_QUERIES
    fmt = input_format("--queries", require_input("--queries", queries), args.format)
    table = open_table("--table", args.table, options, must_exist=True)
    vp = table.properties.get("vector")
    text_index = "fts" in table.properties
    if vp is None and not text_index:
        raise JobError(f"--table {args.table}: the table has no vector index and no text "
                       "index, so there is nothing to search; load it with --vector-column "
                       "and/or --text-columns")
    if args.mode == "vector" and vp is None:
        raise JobError(f"--mode vector: the table at {args.table} has no vector index")
    if args.mode in ("text", "hybrid") and not text_index:
        raise JobError(f"--mode {args.mode}: the table at {args.table} has no text index")
    names = table.user_schema.names
    expr = None
    if args.filter:
        try:
            expr = checked_filter(args.filter, table.user_schema)
        except ValueError as exc:
            raise JobError(str(exc)) from None
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns \
        else None
    for column in columns or ():
        if column not in names:
            raise JobError(f"--columns: the table has no column {column!r}; its columns are "
                           f"{names}")
    handler = SupertableSearchEnrichmentHandler(
        args.table, mode=args.mode, k=args.k, filter=expr, columns=columns,
        nprobe=args.nprobe, version=table.version, max_batch_size=args.batch_size,
        storage_options=options)
    try:
        handler.__enter__()  # checks mode, columns and indexes against the table now
    except (ValueError, TypeError) as exc:
        raise JobError(f"--table {args.table}: {exc}") from None
    handler.__exit__(None, None, None)
    return Plan(queries, fmt, handler, vp["dim"] if vp else None, text_index)


def build(p: beam.Pipeline, args, todo: Plan, part: str) -> None:
    rows, bad = read_rows(p, "Read", todo.queries, todo.format)
    requests = rows | "ToRequest" >> beam.ParDo(
        _ToRequest(todo.dim, todo.text_index, args.mode)).with_outputs(BAD_TAG, main="ok")
    _ = (requests.ok
         | "Search" >> EnrichWithSupertable(todo.handler)
         | "ToOutput" >> beam.ParDo(_ToOutput(args.mode))
         | "ToJson" >> beam.Map(to_json)
         | "WriteResults" >> beam.io.WriteToText(args.output, shard_name_template="",
                                                 num_shards=1))
    _ = ((bad, requests[BAD_TAG]) | "AllBad" >> beam.Flatten()
         | "BadJson" >> beam.Map(to_json)
         | "WriteInvalid" >> beam.io.WriteToText(part, shard_name_template="", num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (JOB_NAMESPACE,))


def run(argv: Optional[List[str]] = None) -> dict:
    """Runs the job; returns its counters (RejectedRun past ``--max-invalid``)."""
    options, args = parse(build_parser(), job_argv(argv))
    output_file("--output", args.output)
    todo = plan(args)
    dead = DeadLetters(invalid_path(args.output), new_run_id(), "--output")
    local_parents(args.output, dead.part)
    result = run_pipeline(options, build, args, todo, dead.part)
    counts = summarize(result)
    dead.finish()
    invalid = counts.get("unparseable", 0)
    print(
        f"search_supertable: queries={counts.get('queries', 0)} "
        f"results={counts.get('results', 0)} empty={counts.get('empty_results', 0)} "
        f"invalid={invalid} -> {args.output}", flush=True)
    check_invalid(PROG, invalid, counts.get("queries", 0) + invalid, args.max_invalid)
    return counts


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pipelines.search_supertable``: runs the job; returns the exit status."""
    return job_main(run, argv, PROG)


if __name__ == "__main__":
    raise SystemExit(main())

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
arguments it answers ``examples/queries.jsonl`` from ``out/chunks`` (the table
``python -m pipelines.load_supertable`` loads by default).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, List, Optional

import apache_beam as beam
import pyarrow.compute as pc
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from beam_supertable import Supertable
from beam_supertable.rag import (
    DEFAULT_MAX_BATCH_SIZE, ENRICHMENT_KEY, MODES, EnrichWithSupertable,
    SupertableSearchEnrichmentHandler)
from pipelines.options import (
    add_job_argument, counter_totals, job_argv, job_options, local_parents, main,
    run_pipeline)
from pipelines.file_rows import (
    BAD_TAG, FORMATS, dead_letter, finite_vector, format_of, read_rows)
from pipelines.io_formats import JOB_NAMESPACE, to_json

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DEFAULT_QUERIES = os.path.join(EXAMPLES, "queries.jsonl")
DEFAULT_TABLE = os.path.join("out", "chunks")
DEFAULT_OUTPUT = os.path.join("out", "search_results.jsonl")
DEFAULT_K = 3

_LITERAL = r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false'
_CLAUSE = re.compile(rf"\s*(\w+)\s*(==|!=|>=|<=|>|<)\s*({_LITERAL})\s*", re.IGNORECASE)
_AND = re.compile(r"and\s", re.IGNORECASE)
_OPS = {"==": "__eq__", "!=": "__ne__", ">=": "__ge__", "<=": "__le__", ">": "__gt__",
        "<": "__lt__"}


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
        if raw[0] in "\"'":
            value: Any = json.loads(raw) if raw[0] == '"' else raw[1:-1]
        elif raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            value = float(raw) if re.search(r"[.eE]", raw) else int(raw)
        clause = getattr(pc.field(column), _OPS[op])(value)
        expr = clause if expr is None else expr & clause
        pos = m.end()
        if pos == len(text):
            return expr
        more = _AND.match(text, pos)
        if not more:
            raise ValueError(f"--filter: expected 'and' before {text[pos:]!r}")
        pos = more.end()


class SearchSupertableOptions(PipelineOptions):
    """Options of the search_supertable job."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_job_argument(
            parser, "--queries", default=None,
            help="Queries (a path or glob): JSON lines, Parquet or CSV rows with id, text "
                 "and/or vector. Default: the sample examples/queries.jsonl.")
        add_job_argument(
            parser, "--format", choices=("auto",) + FORMATS, default="auto",
            help="Format of the queries (default: by extension).")
        add_job_argument(
            parser, "--table", default=DEFAULT_TABLE, help="The supertable (default: %(default)s).")
        add_job_argument(
            parser, "--output", default=DEFAULT_OUTPUT,
            help="Results, one JSON line per query (default: %(default)s). Malformed queries "
                 "go to <output>.invalid.jsonl.")
        add_job_argument(
            parser, "--k", type=int, default=DEFAULT_K, help="Results per query (default: %(default)s).")
        add_job_argument(
            parser, "--mode", choices=MODES, default="auto",
            help="vector, text, hybrid, or auto: each query by what it carries, both -> hybrid "
                 "(default: %(default)s).")
        add_job_argument(
            parser, "--filter", default=None,
            help="Rows must pass, e.g. 'topic == \"space\" and year >= 2010'.")
        add_job_argument(
            parser, "--columns", default=None,
            help="Comma-separated columns to return (default: all but the vector).")
        add_job_argument(
            parser, "--nprobe", type=int, default=None,
            help="Vector cells probed per query (default: the table's).")
        add_job_argument(
            parser, "--batch-size", "--batch_size", dest="batch_size", type=int,
            default=DEFAULT_MAX_BATCH_SIZE,
            help="Most queries per search call (default: %(default)s).")


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


def build(p: beam.Pipeline, job: SearchSupertableOptions) -> None:
    queries = job.queries or DEFAULT_QUERIES
    table = Supertable.open(job.table)
    vp = table.properties.get("vector")
    handler = SupertableSearchEnrichmentHandler(
        job.table, mode=job.mode, k=job.k,
        filter=parse_filter(job.filter) if job.filter else None,
        columns=[c.strip() for c in job.columns.split(",")] if job.columns else None,
        nprobe=job.nprobe, version=table.version, max_batch_size=job.batch_size)
    handler.__enter__()  # checks mode, columns and indexes against the table now
    handler.__exit__(None, None, None)
    rows, bad = read_rows(p, "Read", queries, format_of(queries, job.format))
    requests = rows | "ToRequest" >> beam.ParDo(
        _ToRequest(vp["dim"] if vp else None, "fts" in table.properties, job.mode)).with_outputs(BAD_TAG, main="ok")
    _ = (requests.ok
         | "Search" >> EnrichWithSupertable(handler)
         | "ToOutput" >> beam.ParDo(_ToOutput(job.mode))
         | "ToJson" >> beam.Map(to_json)
         | "WriteResults" >> beam.io.WriteToText(job.output, shard_name_template="",
                                                 num_shards=1))
    _ = ((bad, requests[BAD_TAG]) | "AllBad" >> beam.Flatten()
         | "BadJson" >> beam.Map(to_json)
         | "WriteInvalid" >> beam.io.WriteToText(invalid_path(job.output),
                                                 shard_name_template="", num_shards=1))


def summarize(result) -> dict:
    return counter_totals(result, (JOB_NAMESPACE,))


def run(argv: Optional[List[str]] = None) -> dict:
    options, job = job_options(job_argv(argv), SearchSupertableOptions,
                               "python -m pipelines.search_supertable", __doc__,
                               raw_description=True)
    local_parents(job.output)
    result = run_pipeline(options, build, job)
    counts = summarize(result)
    print(
        f"search_supertable: queries={counts.get('queries', 0)} "
        f"results={counts.get('results', 0)} empty={counts.get('empty_results', 0)} "
        f"invalid={counts.get('unparseable', 0)} -> {job.output}")
    return counts


if __name__ == "__main__":
    main(run)

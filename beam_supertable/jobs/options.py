"""What every job shares: strict flags, one-line errors, exit statuses, dead letters.

A job's command line holds its own flags and Beam's pipeline options
(``--runner``, ``--flink_master``, ``--environment_type`` ...). Beam alone
would discard an argument it does not know (``Discarding unparseable args``)
and run the job with its defaults; here an argument neither the job nor Beam
knows stops the job before anything runs (exit 2), naming the closest flag.

Exit statuses, the same for every job:

- 0: the job did what it was asked;
- 1: a mistake the job found before writing anything (a missing input, a path
  that is not a table, a schema that does not parse, bad JSON in a flag, a
  column the table lacks ...) or a failure while running: one line on
  stderr, the traceback with ``--debug``;
- 2: a bad command line (an unknown flag, a flag's value of the wrong form);
- 3: the job ran and committed what was valid, but rejected more input than
  ``--max-invalid`` allows (by default: all of it). The summary line and the
  dead letters are written first.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import functools
import json
import logging
import os
import re
import sys
import traceback
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_supertable._version import __version__
from beam_supertable.cli import parse_bytes, table_location_problem
from beam_supertable.jobs import flink
from beam_supertable.jobs._launch import quiet_logging

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 3
_LOG = logging.getLogger(__name__)


class JobError(ValueError):
    """A mistake the user can fix, found by the job: one line on stderr, exit 1."""


class RejectedRun(Exception):
    """The run rejected more than ``--max-invalid`` allows: exit 3."""


# -- the parser -----------------------------------------------------------------------------------
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every help line ends ``(default: X)`` when the flag has a default worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "(default" in text or not action.option_strings
                or default is None
                or default is False or default is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class JobParser(argparse.ArgumentParser):
    """argparse with one-line usage errors, no abbreviations and Beam's flags accepted."""

    def __init__(self, prog: str, description: Optional[str], *, rejects: bool = True) -> None:
        # ``rejects``: the job rejects input (--max-invalid, exit 3); optimize does not.
        super().__init__(
            prog=prog, description=description, formatter_class=HelpFormatter,
            allow_abbrev=False,
            epilog="Any Beam pipeline option (--runner, --flink_master, --environment_type, "
                   "--setup_file, ...) is accepted too. Exit status: 0 done; 1 an error "
                   "(one line; --debug for the traceback); 2 a bad command line"
                   + ("; 3 more input rejected than --max-invalid allows." if rejects else "."))
        self.add_argument("--version", action="version",
                          version=f"%(prog)s (beam-upsert-supertable {__version__})")
        self.add_argument("--verbose", action="store_true",
                          help="show Beam's and the stores' log messages too")
        self.add_argument("--debug", action="store_true",
                          help="print the traceback of an error (implies --verbose)")

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-options", "--storage_options", dest="storage_options", default=None,
        metavar="JSON",
        help="fsspec storage options of the table as a JSON object, e.g. "
             "'{\"client_kwargs\": {\"endpoint_url\": \"http://127.0.0.1:9000\"}}'")


def add_schema_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--schema-mode", "--schema_mode", dest="schema_mode", choices=("strict", "merge"),
        default="strict",
        help="strict (the default): input columns the table lacks are refused; merge: they "
             "are added to the table (one schema commit; existing rows read null in them)")


def add_max_invalid(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--max-invalid", "--max_invalid", dest="max_invalid", type=_max_invalid_type,
        default=None, metavar="N|P%",
        help=f"exit 3 when more {what} than this are rejected: a count (0: any) or a share "
             f"of the input (5%%); without it, only a run that rejected all its {what} does")


def add_dead_letters(parser: argparse.ArgumentParser, job: str) -> None:
    parser.add_argument(
        "--dead-letters", "--dead_letters", dest="dead_letters", default=None, metavar="PATH",
        help="JSON lines of the input not applied, each with the reason; each run appends "
             "its own (a local file) or writes PATH's name with the run id added (a URI). "
             f"Default: <table>.invalid.jsonl beside a local table, else out/{job}.invalid.jsonl")


@functools.lru_cache(maxsize=1)
def _beam_parser() -> argparse.ArgumentParser:
    """A parser of every pipeline option Beam (and anything imported) declares."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser  # noqa: PLC2701
    parser = _BeamArgumentParser(allow_abbrev=False, conflict_handler="resolve", add_help=False)
    seen, todo = set(), list(PipelineOptions.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        try:
            cls._add_argparse_args(parser)  # noqa: SLF001 (Beam's documented hook)
        except argparse.ArgumentError:
            continue
    return parser


def _flags_of(parser: argparse.ArgumentParser) -> List[str]:
    return [s for a in parser._actions for s in a.option_strings  # noqa: SLF001
            if s.startswith("--")]


def parse(parser: JobParser, argv: Sequence[str]) -> Tuple[PipelineOptions, argparse.Namespace]:
    """The job's flags and Beam's, strictly: anything else exits 2 naming the closest flag.

    Returns:
        ``(options, args)``: Beam's pipeline options (Flink defaults filled
        in), built from Beam's flags only, and the job's own flags.
    """
    # An unknown flag is the likelier mistake (``--tabel`` for a required
    # ``--table``), so it is reported before a missing required one.
    argv = _switch_values(parser, argv)
    _refuse_repeats(parser, argv)
    argv = _join_dash_values(parser, argv)
    required = [a for a in parser._actions if a.required]
    for action in required:
        action.required = False
    try:
        args, rest = parser.parse_known_args(list(argv))
    finally:
        for action in required:
            action.required = True
    beam_parser = _beam_parser()
    _, unknown = beam_parser.parse_known_args(rest)
    if unknown:
        parser.error(_unknown_message(unknown[0], _flags_of(parser), _flags_of(beam_parser)))
    for dest in ("input", "queries", "commands", "prior", "replay"):   # the input files
        value = getattr(args, dest, None)   # Beam matches no glob without a folder: add ./
        if isinstance(value, str) and "://" not in value and not os.path.dirname(value) \
                and any(c in value for c in "*?["):
            setattr(args, dest, os.path.join(".", value))
    missing = [a.option_strings[0] for a in required if getattr(args, a.dest) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    options = flink.fill_defaults(PipelineOptions(rest), rest)
    problem = runner_problem(options)
    if problem:
        parser.error(problem)
    return options, args


def _join_dash_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> List[str]:
    """``--max-invalid -5%`` as ``--max-invalid=-5%``: a value that starts with ``-`` (and is
    no flag) reaches the flag's own check instead of argparse's "expected one argument"."""
    takes_value = {s for a in parser._actions for s in a.option_strings  # noqa: SLF001
                   if a.nargs is None and not isinstance(
                       a, (argparse._StoreTrueAction, argparse._StoreFalseAction,  # noqa: SLF001
                           argparse._VersionAction, argparse._HelpAction))}  # noqa: SLF001
    known = set(_flags_of(parser)) | set(_flags_of(_beam_parser()))
    out: List[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        arg = items[i]
        if (arg in takes_value and i + 1 < len(items) and items[i + 1].startswith("-")
                and items[i + 1] != "--" and items[i + 1].split("=", 1)[0] not in known):
            out.append(f"{arg}={items[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def runner_problem(options: PipelineOptions) -> Optional[str]:
    """A ``--runner`` Beam does not know, as a usage error naming the runners; else None."""
    from apache_beam.options.pipeline_options import StandardOptions
    name = options.view_as(StandardOptions).runner
    if not name or "." in name:   # the default, or a runner class by its full path
        return None
    known = list(getattr(StandardOptions, "ALL_KNOWN_RUNNERS", ()))
    names = sorted({p.rsplit(".", 1)[-1] for p in known}
                   | set(getattr(StandardOptions, "KNOWN_RUNNER_NAMES", ())))
    if not names:   # a Beam that names its runners otherwise: let it decide
        return None
    lowered = {n.lower() for n in names} | {"pythonrpcdirectrunner"}
    if name.lower() in lowered or name.lower() + "runner" in lowered:
        return None
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"--runner {name}: not a runner Beam knows; {hint}the runners: {', '.join(names)}"


def _switch_values(parser: JobParser, argv: Sequence[str]) -> List[str]:
    """``--dry_run=true`` as ``--dry_run``, ``=false`` as nothing: a Flex Template
    passes every parameter with a value (``beam_supertable.jobs.template_spec``)."""
    switches = {s for a in parser._actions if isinstance(a, argparse._StoreTrueAction)  # noqa: SLF001
                for s in a.option_strings}
    out: List[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + list(argv[i:])
        name, equals, value = arg.partition("=")
        if not equals or name not in switches:
            out.append(arg)
        elif value.lower() in ("true", "false"):
            out.extend([name] if value.lower() == "true" else [])
        else:
            parser.error(f"{name}: a switch; give it alone, or ={value!r} as true or false")
    return out


def _refuse_repeats(parser: JobParser, argv: Sequence[str]) -> None:
    """A flag of the job given twice is a mistake (which one was meant?): exit 2."""
    dest = {s: a.dest for a in parser._actions for s in a.option_strings}  # noqa: SLF001
    seen: Dict[str, str] = {}
    for arg in argv:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if name in dest and dest[name] not in ("help", "version"):
            if dest[name] in seen:
                parser.error(f"{name}: given twice (first as {seen[dest[name]]}); give it once")
            seen[dest[name]] = name


def _unknown_message(arg: str, own: List[str], beams: List[str]) -> str:
    if not arg.startswith("-"):
        return f"{arg!r}: unexpected argument (the jobs take flags only; --help lists them)"
    name = arg.split("=", 1)[0]
    close = (difflib.get_close_matches(name, own, n=1, cutoff=0.6)
             or difflib.get_close_matches(name, beams, n=1, cutoff=0.75))
    hint = f"did you mean {close[0]}?" if close else "--help lists the job's flags"
    return f"{name}: unknown flag; {hint}"


# -- flag values ----------------------------------------------------------------------------------
def _max_invalid_type(text: str) -> Tuple[str, float]:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", text)
    if not match or (not match.group(2) and "." in match.group(1)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a count (say 10) or a share (5%)")
    value = float(match.group(1))
    if match.group(2) and value > 100:
        raise argparse.ArgumentTypeError(f"{text!r}: a share is at most 100%")
    return ("share", value) if match.group(2) else ("count", value)


def byte_size(text: str) -> int:
    """argparse type: ``67108864``, ``64MiB``, ``1GB`` (as ``python -m beam_supertable``)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def storage_options(args: argparse.Namespace) -> Optional[dict]:
    """``--storage-options`` as a dict; JobError naming the flag when it is not a JSON object."""
    text = getattr(args, "storage_options", None)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise JobError(f"--storage-options: not valid JSON ({exc}); expected an object such as "
                       "'{\"anon\": false}'") from None
    if not isinstance(value, dict):
        raise JobError(f"--storage-options: expected a JSON object, got "
                       f"{type(value).__name__}")
    return value


def same_columns(a, b) -> bool:
    """Two schemas with the same column names and types (nullability aside)."""
    return [(f.name, f.type) for f in a] == [(f.name, f.type) for f in b]


def schema_difference(given, held) -> Optional[str]:
    """How ``--schema`` (``given``) differs from a table's schema (``held``), in words
    naming the columns and their types; None when they agree (nullability aside)."""
    from beam_supertable.format.row_reasons import type_name
    if same_columns(given, held):
        return None
    if given.names != held.names:
        return f"the table's columns are {held.names}, --schema's {given.names}"
    differ = [(f.name, type_name(f.type), type_name(held.field(f.name).type))
              for f in given if f.type != held.field(f.name).type]
    return "; ".join(f"column {name!r} is {theirs} in the table, {ours} in --schema"
                     for name, ours, theirs in differ)


def split_columns(spec: Optional[str]) -> List[str]:
    """``"a, b"`` -> ``["a", "b"]``; None or empty -> ``[]``."""
    return [c.strip() for c in spec.split(",") if c.strip()] if spec else []


# -- running --------------------------------------------------------------------------------------
def counter_totals(result: Any, namespaces: Iterable[str]) -> Dict[str, int]:
    """The job's counters in ``namespaces``, by name (committed where the runner has them)."""
    wanted = set(namespaces)
    got: Dict[str, int] = {}
    for c in result.metrics().query()["counters"]:
        if c.key.metric.namespace not in wanted:
            continue
        value = c.committed if c.committed is not None else c.attempted
        got[c.key.metric.name] = got.get(c.key.metric.name, 0) + (value or 0)
    return got


def run_pipeline(options: PipelineOptions, build: Callable[..., Any], *args: Any) -> Any:
    """Builds a job's pipeline with ``build(pipeline, *args)`` and runs it to the end.

    Returns:
        The finished ``PipelineResult`` (its counters for the job's summary).
    """
    p = beam.Pipeline(options=options)
    build(p, *args)
    result = p.run()
    result.wait_until_finish()
    return result


def job_argv(argv: Optional[Sequence[str]]) -> List[str]:
    """The job's arguments: ``argv``, or the command line's."""
    return list(sys.argv[1:] if argv is None else argv)


def check_invalid(prog: str, invalid: int, total: int,
                  limit: Optional[Tuple[str, float]]) -> None:
    """Raises RejectedRun when ``invalid`` of ``total`` is beyond ``--max-invalid``.

    Without a limit only a run that rejected everything it read fails.
    """
    if limit is None:
        if total and invalid >= total:
            raise RejectedRun(f"every one of the {total} input records was rejected; "
                              "see the dead letters")
        return
    kind, value = limit
    over = invalid > value if kind == "count" else (total and 100.0 * invalid / total > value)
    if over:
        allowed = f"{value:g}" if kind == "count" else f"{value:g}%"
        raise RejectedRun(f"{invalid} of {total} input records rejected, more than "
                          f"--max-invalid {allowed}; see the dead letters")


def main(run: Callable[[List[str]], Any], argv: Optional[Sequence[str]], prog: str) -> int:
    """A job's entry point: ``run(argv)``, its errors as one line; returns the exit status."""
    args = job_argv(argv)
    debug = "--debug" in args or "--debug=true" in args
    quiet_logging(verbose=debug or "--verbose" in args or "--verbose=true" in args)
    try:
        run(args)
    except RejectedRun as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure ends as one line, see below
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {error_line(exc)}"
              + ("" if debug or isinstance(exc, JobError) else " (--debug shows the traceback)"),
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def error_line(exc: BaseException) -> str:
    """An exception as one line: a JobError's message, else ``Type: first line``."""
    lines = [s for s in str(exc).strip().splitlines() if s.strip()]
    text = lines[0].strip() if lines else ""
    if isinstance(exc, JobError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- paths ----------------------------------------------------------------------------------------
def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def local_parents(*paths: Optional[str]) -> None:
    """Creates the folders that local ``paths`` will be written into (URIs are left alone)."""
    for path in paths:
        if path and "://" not in path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def require_input(flag: str, pattern: str) -> str:
    """The first file ``pattern`` matches; JobError naming the flag when none does."""
    try:
        metadata = FileSystems.match([pattern])[0].metadata_list
    except Exception as exc:  # noqa: BLE001 - the filesystem's own error types vary
        raise JobError(f"{flag} {pattern}: cannot list it ({error_line(exc)})") from None
    if not metadata:
        raise JobError(f"{flag} {pattern}: no such file (or no file matches the pattern)")
    return sorted(m.path for m in metadata)[0]


def input_format(flag: str, path: str, explicit: Optional[str] = None) -> str:
    """The format of the input file at ``path`` (named, or by its extension), checked
    against what the file's first bytes look like; JobError naming ``flag`` and the
    format the file looks like when they disagree."""
    from beam_supertable.jobs.file_rows import check_format, format_of
    try:
        fmt = format_of(path, explicit)
        check_format(path, fmt)
    except ValueError as exc:
        text = str(exc)
        raise JobError(f"{flag} {text}" if text.startswith(path)
                       else f"{flag} {path}: {text}") from None
    return fmt


def open_table(flag: str, uri: str, options: Optional[dict], *, must_exist: bool = False):
    """The table at ``uri``, or None where none is yet (a new table may be made there).

    Raises:
        JobError: a local path that is a file, or a folder holding other things
            than a table; with ``must_exist``, no table there.
    """
    from beam_supertable import Supertable
    problem = table_location_problem(flag, uri, options)
    if problem:
        raise JobError(problem)
    if is_local(uri):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        if (os.path.isdir(path) and os.listdir(path)
                and not os.path.isdir(os.path.join(path, "_supertable"))):
            raise JobError(f"{flag} {uri}: the folder holds files but no supertable "
                           "(no _supertable/); name a new or an existing table")
    try:
        return Supertable.open(uri, storage_options=options)
    except FileNotFoundError:
        if must_exist:
            raise JobError(f"{flag} {uri}: no supertable there") from None
        return None


# -- dead letters ---------------------------------------------------------------------------------
def new_run_id(job_id: Optional[str] = None) -> str:
    """``job_id``, else a sortable unique id: ``20261203T214500Z-1a2b3c4d``."""
    if job_id:
        return job_id
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


def writable_file(flag: str, path: str) -> str:
    """``path`` if a job can write a file there; else JobError naming ``flag``.

    Checked before anything runs: a folder is never replaced by a file (it
    may hold a table), and a URI needs a filesystem Beam knows.
    """
    if not path or not path.strip():
        raise JobError(f"{flag}: empty path")
    if path.endswith(("/", "\\")):
        raise JobError(f"{flag} {path}: names a folder (it ends with /); name a file")
    if is_local(path):
        local = path[len("file://"):] if path.startswith("file://") else path
        if os.path.isdir(local):
            raise JobError(f"{flag} {path}: is a folder; name a file")
        parent = os.path.dirname(os.path.abspath(local))
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and not os.path.isdir(parent):
            raise JobError(f"{flag} {path}: {parent} is a file, not a folder")
        return path
    try:
        FileSystems.get_filesystem(path)
    except ValueError as exc:
        raise JobError(f"{flag} {path}: no filesystem for this URI in Beam ({exc})") from None
    return path


_OUTPUT_FORMATS = {".jsonl": "JSON lines", ".ndjson": "JSON lines", ".json": "JSON lines",
                   ".parquet": "Parquet", ".pq": "Parquet"}


def output_file(flag: str, path: str, parquet: bool = False) -> str:
    """``path`` if a job can write its output there, in a format its extension names.

    A job writes JSON lines (and, with ``parquet``, Parquet); a name ending in
    another known data format's extension (``.csv``, ``.avro`` ...) would get
    JSON lines under a name that says otherwise, so it is refused. A name
    without an extension gets JSON lines.
    """
    writable_file(flag, path)
    ext = os.path.splitext(path.rstrip("/"))[1].lower()
    written = "JSON lines (.jsonl)" + (" or Parquet (.parquet)" if parquet else "")
    if ext in _OUTPUT_FORMATS and (parquet or _OUTPUT_FORMATS[ext] != "Parquet"):
        return path
    if ext in _OUTPUT_FORMATS or ext in (".csv", ".tsv", ".avro", ".orc", ".txt", ".xlsx"):
        raise JobError(f"{flag} {path}: the job writes {written}, not {ext[1:]}; "
                       f"name the output with one of those extensions")
    return path


def default_dead_letters(table: str, given: Optional[str], job: str) -> str:
    """``given``, else beside a local table, else ``out/<job>.invalid.jsonl``."""
    if given:
        return given
    if is_local(table):
        return table.rstrip("/\\") + ".invalid.jsonl"
    return os.path.join("out", f"{job}.invalid.jsonl")


class DeadLetters:
    """Where one run's dead letters go, without erasing an earlier run's.

    The pipeline writes the run's records to :attr:`part` (beside the target);
    :meth:`finish` then appends them to a local target, each record gaining
    ``run`` (and whatever else is given, e.g. the table version), or, for a
    target on an object store (which cannot append), writes them under the
    target's name with the run id added. Either way :attr:`path` names where
    this run's records are.
    """

    def __init__(self, target: str, run_id: str, flag: str = "--dead-letters") -> None:
        writable_file(flag, target)
        self.target, self.run_id = target, run_id
        stem, ext = os.path.splitext(target)
        self.part = f"{target}.{run_id}.part"
        self.path = target if is_local(target) else f"{stem}.{run_id}{ext or '.jsonl'}"

    def finish(self, **extra: Any) -> int:
        """Moves the run's records into place; returns how many there were."""
        records = []
        if FileSystems.exists(self.part):
            with FileSystems.open(self.part) as f:
                for line in f.read().decode("utf-8").splitlines():
                    if line.strip():
                        record = json.loads(line)
                        record.update({"run": self.run_id, **extra})
                        records.append(json.dumps(record, sort_keys=True))
            FileSystems.delete([self.part])
        text = "".join(r + "\n" for r in records)
        if is_local(self.path):
            path = self.path[len("file://"):] if self.path.startswith("file://") else self.path
            local_parents(path)
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
        elif records:
            with FileSystems.create(self.path) as f:
                f.write(text.encode("utf-8"))
        return len(records)

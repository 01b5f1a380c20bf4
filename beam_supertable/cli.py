"""The command line: ``python -m beam_supertable {inspect,optimize,vacuum,iceberg,consumers,drop-consumer,add-columns,drop-columns,rename-column,restore,tag} --table URI``.

``python -m beam_supertable template-spec JOB`` prints a job's Dataflow Flex
Template metadata (:mod:`beam_supertable.jobs.template_spec`).

Installed, the same is the console script ``beam-supertable``::

    python -m beam_supertable inspect --table /data/docs
    python -m beam_supertable inspect --table s3://bucket/docs --json \\
        --storage-options '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}'
    python -m beam_supertable optimize --table /data/docs --dry-run
    python -m beam_supertable optimize --table /data/docs --max-rewrite-bytes 8GiB --vacuum-after
    python -m beam_supertable vacuum --table /data/docs --older-than 6h --retain-versions 10
    python -m beam_supertable iceberg sync --table /data/docs
    python -m beam_supertable consumers --table /data/docs
    python -m beam_supertable drop-consumer --table /data/docs --name mirror
    python -m beam_supertable iceberg register --table /data/docs \\
        --catalog sqlite:////data/catalog.db --name docs.chunks
    python -m beam_supertable tag /data/docs create nightly 12

The subcommands that change a table's shape or name versions (``add-columns``,
``drop-columns``, ``rename-column``, ``restore``, ``tag``) are
:mod:`beam_supertable.cli_alter`.

The table is named by ``--table``, as in the jobs (``python -m pipelines.<job>``);
a table given as the first positional argument, as earlier releases took it,
still works.

Each subcommand takes the options of the API call it runs (``inspect_table``,
``Supertable.optimize``, ``Supertable.vacuum``); ``--json`` prints the result
as one JSON document for scripts. Durations are written ``6h``, ``30m``,
``90s``, ``1d`` or combined (``1h30m``); byte sizes as an integer or with a
binary unit (``64MiB``). Omitting ``--older-than`` means the API's default
grace period (6 hours), never zero.

Exit status: 0 on success, 1 when the operation fails (no table at the URI,
a commit that did not land, a store error), 2 for a bad argument. Errors are
one line on stderr naming the URI or the argument, without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import importlib
import json
import logging
import os
import re
import sys
import traceback
from typing import Any, Callable, Optional, Sequence

from beam_supertable import cli_alter
from beam_supertable._program import program_name
from beam_supertable._version import __version__
from beam_supertable.cli_text import (
    DURATION_UNITS, Progress, duration_text, format_inspection, plan_text, plural, ranges, size)
from beam_supertable.errors import SupertableError
from beam_supertable.format.consumers import check_name
from beam_supertable.format.vacuum import DEFAULT_VACUUM_GRACE_S
from beam_supertable.format.writer import TARGET_SUPERFILE_BYTES
from beam_supertable.table.inspection import inspect_table

__all__ = ["Progress", "format_inspection", "main", "parse_bytes", "parse_duration",
           "table_location_problem"]

PROG = program_name("python -m beam_supertable")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_BYTE_UNITS = {"": 1, "b": 1, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40,
               "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}
_BYTES = re.compile(r"(\d+)\s*([kmgt]i?b|b)?", re.IGNORECASE)


# The stores' clients log retries and housekeeping; shown with --verbose.
_NOISY_LOGGERS = ("fsspec", "s3fs", "botocore", "aiobotocore", "urllib3")


# Options fsspec's local and memory filesystems take; anything else they would ignore.
_FS_OPTIONS = ("listings_expiry_time", "max_paths", "skip_instance_cache", "use_listings_cache")
_LOCAL_OPTIONS = {"file": ("auto_mkdir",) + _FS_OPTIONS, "memory": _FS_OPTIONS}


def table_location_problem(flag: str, uri: Optional[str],
                           storage_options: Optional[dict] = None) -> Optional[str]:
    """What is wrong with a table's location, as one line naming ``flag``; None if nothing.

    The same for the jobs and this command line: an empty path, a local path
    that is a file, and storage options a local or memory table cannot take
    (fsspec would ignore them silently).
    """
    if uri is None or not uri.strip():
        return f"{flag}: empty path"
    scheme = "file" if "://" not in uri else uri.split("://", 1)[0].lower()
    if scheme == "file":
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        if os.path.exists(path) and not os.path.isdir(path):
            return f"{flag} {uri}: is a file, not a table (a table is a folder)"
        parent = os.path.dirname(os.path.normpath(path))
        while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
            parent = os.path.dirname(parent)
        if parent and os.path.exists(parent) and not os.path.isdir(parent):
            return f"{flag} {uri}: {parent} is a file, so no table can be inside it"
    allowed = _LOCAL_OPTIONS.get(scheme)
    if allowed is not None and storage_options:
        unknown = sorted(k for k in storage_options if k not in allowed)
        if unknown:
            where = "a local table" if scheme == "file" else "a memory:// table"
            return (f"--storage-options: {unknown[0]!r} is not an option of {where} "
                    f"(it takes {', '.join(allowed)})")
    return None


# -- argument types ------------------------------------------------------------
def parse_duration(text: str) -> datetime.timedelta:
    """``6h``, ``30m``, ``0s``, ``1h30m``, ``2d``, ``1w`` as a timedelta; ``0`` alone too.

    Raises:
        ValueError: anything else (a bare number other than 0 has no unit:
            ``6`` could mean seconds or hours).
    """
    text = text.strip()
    if text == "0":
        return datetime.timedelta(0)
    pos, seconds = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(text):
        raise ValueError(f"{text!r} is not a duration; write e.g. 6h, 30m, 90s, 1h30m or 0s")
    return datetime.timedelta(seconds=seconds)


def parse_positive_duration(text: str) -> datetime.timedelta:
    """``parse_duration``, refusing zero (a retention of nothing is no retention)."""
    value = parse_duration(text)
    if value <= datetime.timedelta(0):
        raise ValueError(f"{text!r}: must be longer than 0, e.g. 1h, 7d or 2w")
    return value


def parse_bytes(text: str) -> int:
    """``67108864``, ``64MiB``, ``1GB`` as a positive number of bytes."""
    match = _BYTES.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a byte size; write e.g. 67108864, 64MiB or 1GiB")
    value = int(match.group(1)) * _BYTE_UNITS[(match.group(2) or "").lower()]
    if value <= 0:
        raise ValueError(f"{text!r}: a byte size must be > 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{text!r}: must be >= 1")
    return value


def _storage_options(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {type(value).__name__}")
    return value


def _argument_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``parse`` as an argparse type whose error is ``parse``'s own message."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: argument ...: why``)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Help lines end ``(default: X)`` where a default is worth showing, as in the jobs."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("%(default)" in text or "(default" in text or not action.option_strings
                or action.default in (None, False, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Inspect and maintain a supertable.",
                     formatter_class=_HelpFormatter, allow_abbrev=False)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s (beam-upsert-supertable {__version__})")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log each commit retry and store request retry")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    duration = _argument_type(parse_duration, "duration")
    positive_duration = _argument_type(parse_positive_duration, "duration")
    nbytes = _argument_type(parse_bytes, "byte size")
    count = _argument_type(_positive_int, "count")
    subcommands: dict = {}
    parser.set_defaults(subcommands=subcommands)

    def options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--table", dest="table", metavar="URI", default=None,
                         help="the table: a local path, memory://..., s3://bucket/prefix, ... "
                              "(required)")
        subcommands[sub.prog[len(PROG) + 1:]] = sub
        sub.add_argument("--storage-options", type=_argument_type(_storage_options, "JSON"),
                         default=None, metavar="JSON",
                         help="fsspec storage options as a JSON object")
        sub.add_argument("--json", action="store_true", help="print the result as JSON")

    def command(name: str, help_text: str, under=commands) -> argparse.ArgumentParser:
        sub = under.add_parser(name, help=help_text, description=help_text,
                               formatter_class=_HelpFormatter, allow_abbrev=False)
        options(sub)
        sub.add_argument("uri", metavar="URI", nargs="?", default=None,
                         help="the table, given without --table (either form; not both)")
        return sub

    def vacuum_options(sub: argparse.ArgumentParser, what: str) -> None:
        sub.add_argument("--older-than", type=duration, default=None, metavar="DURATION",
                         help=f"grace period of the {what} (default: "
                              f"{duration_text(DEFAULT_VACUUM_GRACE_S)}); 0s for none")
        sub.add_argument("--retain-versions", type=count, default=10, metavar="N",
                         help=f"newest versions the {what} keeps")

    inspect = command("inspect", "Summarize a table: versions, rows, superfiles, cells, "
                                 "grids, storage, and what a vacuum would reclaim.")
    vacuum_options(inspect, "vacuum whose reclaimable bytes are reported")

    optimize = command("optimize", "Compact small superfiles by cell, drop deleted rows and "
                                   "split oversized cells, in one commit.")
    optimize.add_argument("--target-file-bytes", type=nbytes, default=TARGET_SUPERFILE_BYTES,
                          metavar="N", help="superfile size to aim for (default: 64MiB)")
    optimize.add_argument("--max-cell-rows", type=count, default=None, metavar="N",
                          help="split cells holding more rows than this")
    optimize.add_argument("--max-rewrite-bytes", type=nbytes, default=None, metavar="N",
                          help="rewrite at most this much in one run (incremental optimize)")
    optimize.add_argument("--dry-run", action="store_true",
                          help="print what would be rewritten; change nothing")
    optimize.add_argument("--vacuum-after", action="store_true",
                          help="vacuum after a successful optimize")
    vacuum_options(optimize, "vacuum run by --vacuum-after")

    vacuum = command("vacuum", "Delete versions and objects no retained version needs, "
                               "after a grace period.")
    vacuum_options(vacuum, "vacuum")
    vacuum.add_argument("--dry-run", action="store_true",
                        help="print what would be deleted; delete nothing")
    vacuum.add_argument("--token-retention", type=positive_duration, default=None, metavar="DURATION",
                        help="how long tokens are remembered; set on the table first "
                             "(default: the table's token_retention, 7 days unless set)")

    command("consumers", "List the change feed's named consumers: each one's version, "
                         "when it last recorded, and whether it still holds versions "
                         "from vacuum.")
    drop = command("drop-consumer", "Forget a named consumer of the change feed: vacuum "
                                    "stops holding versions for it.")
    drop.add_argument("--name", dest="name", metavar="NAME", default=None,
                      help="the consumer to drop (required; or as the last argument)")
    drop.add_argument("name_arg", metavar="NAME", nargs="?", default=None,
                      help=argparse.SUPPRESS)

    cli_alter.add_parsers(commands, options, _HelpFormatter)

    iceberg = commands.add_parser(
        "iceberg", help="The table's Apache Iceberg metadata: sync, register.",
        description="The table's Apache Iceberg metadata: sync, register.",
        formatter_class=_HelpFormatter, allow_abbrev=False)
    actions = iceberg.add_subparsers(dest="iceberg_command", required=True, metavar="ACTION",
                                     parser_class=_Parser)
    command("sync", "Turn the Iceberg metadata on (one commit, when it is off) and write it "
                    "for the latest version; print its location.", under=actions)
    register = command("register", "Register the table's latest version in a pyiceberg SQL "
                                   "catalog (needs pyiceberg); rerun to point it at a newer "
                                   "version.", under=actions)
    register.add_argument("--catalog", required=True, metavar="URI",
                          help="the catalog's SQLAlchemy URI, e.g. sqlite:////data/catalog.db")
    register.add_argument("--name", required=True, metavar="NAMESPACE.TABLE",
                          help="the identifier to register the table under")
    register.add_argument("--catalog-name", default="default", metavar="NAME",
                          help="the catalog's name, as pyiceberg's SqlCatalog(NAME, uri=...) "
                               "is opened (default: default)")
    spec = commands.add_parser(
        "template-spec", help="Print a job's Dataflow Flex Template metadata (JSON), made "
                              "from the job's flags.",
        description="Print a job's Dataflow Flex Template metadata (JSON), made from the "
                    "job's flags: the --metadata-file of gcloud dataflow flex-template build.",
        formatter_class=_HelpFormatter, allow_abbrev=False)
    spec.add_argument("job", metavar="JOB", help="the job's console script (beam-supertable-load, "
                                                 "...) or module (load_supertable, ...)")
    subcommands["template-spec"] = spec
    return parser


def _unknown_message(arg: str, parser: argparse.ArgumentParser) -> str:
    """An argument the subcommand does not take, with the closest flag it does take."""
    if not arg.startswith("-"):
        takes_table = any("--table" in a.option_strings for a in parser._actions)  # noqa: SLF001
        return f"{arg!r}: unexpected argument" + (
            " (the table goes once, as --table or alone)" if takes_table else "")
    flag = arg.split("=", 1)[0]
    flags = [s for a in parser._actions for s in a.option_strings  # noqa: SLF001
             if s.startswith("--")]
    close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
    return f"{flag}: unknown flag; " + (f"did you mean {close[0]}?" if close
                                       else "--help lists the flags")


# -- the commands --------------------------------------------------------------
def _inspect(args: argparse.Namespace) -> Any:
    report = inspect_table(args.uri, args.storage_options,
                           retain_versions=args.retain_versions, older_than=args.older_than)
    return report, format_inspection(report)


def _open(args: argparse.Namespace):
    from beam_supertable.table.supertable import Supertable
    return Supertable.open(args.uri, storage_options=args.storage_options)


def _optimize(args: argparse.Namespace) -> Any:
    table = _open(args)
    progress = Progress(sys.stderr, "optimize")
    try:
        result = table.optimize(
            target_file_bytes=args.target_file_bytes, max_cell_rows=args.max_cell_rows,
            max_rewrite_bytes=args.max_rewrite_bytes, dry_run=args.dry_run,
            vacuum_after=args.vacuum_after, older_than=args.older_than,
            retain_versions=args.retain_versions, progress=progress)
    finally:
        progress.close()
    if args.dry_run:
        plan = result.to_dict()
        return {"uri": args.uri, "dry_run": True, "version": table.version, "plan": plan}, \
            plan_text(args.uri, table.version, plan)
    if result is None:
        return ({"uri": args.uri, "dry_run": False, "optimized": False, "version": table.version},
                f"{args.uri}: nothing to optimize; version {table.version} unchanged")
    return ({"uri": args.uri, "dry_run": False, "optimized": True, "version": result},
            f"{args.uri}: optimized into version {result}"
            + (" and vacuumed" if args.vacuum_after else ""))


def _vacuum(args: argparse.Namespace) -> Any:
    report = _open(args).vacuum(retain_versions=args.retain_versions,
                                older_than=args.older_than, dry_run=args.dry_run,
                                token_retention=args.token_retention)
    doc = {"uri": args.uri, "dry_run": args.dry_run, **dataclasses.asdict(report)}
    doc["consumers"] = [c.to_dict() for c in report.consumers]
    verb = "would remove" if args.dry_run else "removed"
    kept = report.retained_versions
    text = (f"{args.uri}: {verb} {plural(len(report.removed_versions), 'version')} and "
            f"{plural(len(report.removed_objects), 'object')} ({size(report.removed_bytes)}); "
            f"kept {plural(len(kept), 'version')}"
            + (f" ({ranges(kept)})" if kept else "")
            + f"; grace {duration_text(_grace_s(args.older_than))}"
            + (f"; consumers and tags hold {plural(len(report.held_versions), 'version')} "
               f"({size(report.held_bytes)})" if report.held_versions else ""))
    return doc, text


def _consumers(args: argparse.Namespace) -> Any:
    table = _open(args)
    listed = table.consumers()
    doc = {"uri": args.uri, "version": table.version,
           "consumer_expiry_s": table.consumer_expiry.total_seconds(),
           "consumers": [c.to_dict() for c in listed]}
    if not listed:
        return doc, f"{args.uri}: no consumers"
    lines = [f"{args.uri}: {plural(len(listed), 'consumer')} "
             f"(expiry {duration_text(table.consumer_expiry.total_seconds())})"]
    present = set(table._manifest._listed_versions())
    for c in listed:
        state = "expired, holds nothing" if c.expired else \
            "its version was vacuumed, holds nothing" if c.version not in present else \
            f"holds versions {c.version}..{table.version}"
        lines.append(f"  {c.name}: version {c.version}, recorded "
                     f"{duration_text(round(c.age.total_seconds()))} ago; {state}")
    return doc, "\n".join(lines)


def _consumer_name(args: argparse.Namespace) -> str:
    """drop-consumer's name, from ``--name`` or the last argument; a usage error
    (exit 2) when missing, given twice or not a consumer name."""
    if args.name is not None and args.name_arg is not None and args.name != args.name_arg:
        raise ValueError(f"the consumer twice: --name {args.name} and {args.name_arg}")
    name = args.name if args.name is not None else args.name_arg
    if name is None:
        raise ValueError("the following arguments are required: --name")
    return check_name(name)


def _drop_consumer(args: argparse.Namespace) -> Any:
    _open(args).drop_consumer(args.name)
    return {"uri": args.uri, "dropped": args.name}, f"{args.uri}: dropped consumer {args.name}"


def _iceberg(args: argparse.Namespace) -> Any:
    table = _open(args)
    if args.iceberg_command == "sync":
        location = table.sync_iceberg()
        return ({"uri": args.uri, "version": table.version, "metadata_location": location},
                f"{args.uri}: version {table.version} as Iceberg metadata {location}")
    location = table.iceberg_metadata_location()
    registered = register_in_sql_catalog(args.catalog, args.name, location, args.catalog_name)
    return ({"uri": args.uri, "version": table.version, "metadata_location": location,
             "catalog": args.catalog, "identifier": args.name, "replaced": registered},
            f"{args.uri}: version {table.version} registered as {args.name} in {args.catalog}"
            + (" (replacing the earlier entry)" if registered else ""))


def register_in_sql_catalog(catalog_uri: str, identifier: str, location: str,
                            catalog_name: str = "default") -> bool:
    """Points ``identifier`` of a pyiceberg SQL catalog at ``location``.

    Returns:
        True when an earlier entry was replaced (the catalog entry only: no
        file is touched).
    """
    try:
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import NamespaceAlreadyExistsError
    except ImportError as exc:
        raise ValueError("iceberg register needs pyiceberg with SQL support: pip install "
                         "'pyiceberg[sql-sqlite]' (or beam-upsert-supertable[interop])") from exc
    namespace, _, name = identifier.rpartition(".")
    if not namespace or not name:
        raise ValueError(f"--name {identifier}: expected NAMESPACE.TABLE")
    catalog = SqlCatalog(catalog_name, uri=catalog_uri)
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    replaced = catalog.table_exists(identifier)
    if replaced:
        catalog.drop_table(identifier)
    catalog.register_table(identifier, location)
    return replaced


_COMMANDS = {"inspect": _inspect, "optimize": _optimize, "vacuum": _vacuum,
             "iceberg": _iceberg, "consumers": _consumers, "drop-consumer": _drop_consumer,
             **cli_alter.COMMANDS}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one subcommand; returns the exit status (see the module docstring)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    name = args.command + (f" {args.iceberg_command}" if args.command == "iceberg" else "")
    prog = f"{PROG} {name}"
    given = [a for a in (sys.argv[1:] if argv is None else argv)
             if a == "--table" or a.startswith("--table=")]
    if len(given) > 1:   # as the jobs: which one was meant?
        print(f"{prog}: error: --table: given twice; give it once", file=sys.stderr)
        return EXIT_USAGE
    if extra:
        sub = args.subcommands.get(name, parser)
        sub.error(_unknown_message(extra[0], sub))
    if args.command == "template-spec":
        # The jobs sit above this module's layer: reached by name, as _launch does.
        spec = importlib.import_module("beam_supertable.jobs.template_spec")
        return spec.main([args.job], prog=prog)
    if args.command == "drop-consumer" and args.table and args.uri and not args.name_arg:
        args.name_arg, args.uri = args.uri, None   # drop-consumer --table URI NAME
    if args.command in cli_alter.COMMANDS:
        try:
            cli_alter.prepare(args)
        except ValueError as exc:
            parser.exit(EXIT_USAGE, f"{prog}: error: {exc}\n")
    if args.table and args.uri and args.table != args.uri:
        parser.exit(EXIT_USAGE, f"{prog}: error: the table twice: --table {args.table} and "
                                f"{args.uri}\n")
    args.uri = args.table if args.table is not None else args.uri
    if args.uri is None:
        parser.exit(EXIT_USAGE, f"{prog}: error: the following arguments are required: "
                                "--table\n")
    problem = table_location_problem("--table", args.uri, args.storage_options)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return EXIT_FAILED
    if args.command == "drop-consumer":
        try:
            args.name = _consumer_name(args)
        except ValueError as exc:
            parser.exit(EXIT_USAGE, f"{prog}: error: {exc}\n")
    args.verbose = args.verbose or args.debug
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if args.verbose else logging.CRITICAL)
    try:
        doc, text = _COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (SupertableError, OSError, ValueError, TypeError) as exc:
        # The errors a user can act on (no table, a store refusing, a bad
        # option the API rejects) as one line; anything else is a bug and
        # keeps its traceback.
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if args.uri not in message:
            message = f"{args.uri}: {message}"
        print(f"{prog}: error: {type(exc).__name__}: {message}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - the CLI's last resort, see below
        # A store client's own error type (botocore's NoCredentialsError is
        # no OSError) or a bug: still one line, the traceback under -v.
        if args.verbose:
            traceback.print_exc()
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"{prog}: error: {type(exc).__name__}: {args.uri}: {message}"
              + ("" if args.verbose else " (run with --debug for the traceback)"), file=sys.stderr)
        return EXIT_FAILED
    try:
        print(json.dumps(doc, indent=2) if args.json else text, flush=True)
    except BrokenPipeError:
        # The reader went away (``... --json | head``): not an error of ours.
        # Point stdout at nothing so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


# -- text output (the rest: beam_supertable.cli_text) ---------------------------
def _grace_s(older_than: Optional[datetime.timedelta]) -> float:
    return DEFAULT_VACUUM_GRACE_S if older_than is None else older_than.total_seconds()

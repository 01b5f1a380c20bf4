"""The CLI's subcommands that change a table's shape or history, and name versions::

    beam-supertable add-columns TABLE --column unit:string --column emb2:float32[8]
    beam-supertable drop-columns TABLE unit emb2
    beam-supertable rename-column TABLE reading value
    beam-supertable restore TABLE 12            # or a tag's name
    beam-supertable tag TABLE create nightly 12
    beam-supertable tag TABLE delete nightly
    beam-supertable tag TABLE list

The table is the first argument or ``--table URI``; each takes
``--storage-options JSON`` and ``--json`` as the other subcommands do. Column
types are written as in the jobs' ``--schema`` (``int64``, ``string``,
``float32[8]``, ...). Usage mistakes exit 2 with one line.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any, Callable, Dict, List, Sequence

from beam_supertable.format.tags import check_name as check_tag
from beam_supertable.table.column_spec import parse_fields

__all__ = ["COMMANDS", "add_parsers", "prepare"]

TAG_ACTIONS = ("create", "delete", "list")


def _hint(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def add_parsers(commands: Any, parser_options: Callable[[argparse.ArgumentParser], None],
                formatter: type) -> None:
    """Adds the subcommands to ``commands`` (the CLI's subparsers); ``parser_options``
    adds ``--table``, ``--storage-options`` and ``--json`` to each."""

    def command(name: str, help_text: str, words: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text,
                                  formatter_class=formatter, allow_abbrev=False)
        parser_options(sub)
        sub.add_argument("words", nargs="*", metavar=f"TABLE {words}".strip(),
                         help="the table (or --table URI)" + (f", then {words}" if words else ""))
        sub.set_defaults(uri=None)
        return sub

    add = command("add-columns", "Add nullable columns (one metadata-only commit; existing "
                                 "rows read null).", "")
    add.add_argument("--column", action="append", default=None, metavar="NAME:TYPE",
                     help="a column to add, e.g. unit:string or emb2:float32[8] (repeat it, or "
                          "give several separated by commas; required)")
    command("drop-columns", "Drop columns (one metadata-only commit; optimize drops their "
                            "data when it rewrites).", "NAME...")
    command("rename-column", "Rename a column (one metadata-only commit; its values stay).",
            "OLD NEW")
    command("restore", "Commit an earlier version's rows (and schema) as a new version; "
                       "history stays.", "VERSION|TAG")
    command("tag", "Name versions that vacuum keeps: create NAME VERSION, delete NAME, list.",
            "create NAME VERSION | delete NAME | list")


def _version_word(word: str) -> Any:
    """A version number, or a tag's name (a usage error when it is neither)."""
    if word.isdigit():
        return int(word)
    check_tag(word)
    return word


def prepare(args: argparse.Namespace) -> None:
    """Takes the table and the operands from the positional words; raises ValueError
    (a usage error: exit 2) naming what is missing or wrong."""
    words: List[str] = list(args.words)
    if not args.table and words:
        args.uri = words.pop(0)
    command = args.command
    if command == "add-columns":
        if words:
            raise ValueError(f"unexpected argument {words[0]!r}; columns are given as "
                             "--column NAME:TYPE")
        if not args.column:
            raise ValueError("the following arguments are required: --column")
        args.fields = parse_fields(args.column, "--column")
    elif command == "drop-columns":
        if not words:
            raise ValueError("the following arguments are required: NAME (a column to drop)")
        args.names = words
    elif command == "rename-column":
        if len(words) != 2:
            raise ValueError(f"expected OLD NEW (two column names), got {len(words)} "
                             f"argument{'s' if len(words) != 1 else ''}")
        args.old, args.new = words
    elif command == "restore":
        if len(words) != 1:
            raise ValueError("expected one VERSION or TAG" if not words else
                             f"unexpected argument {words[1]!r}; expected one VERSION or TAG")
        args.version = _version_word(words[0])
    elif command == "tag":
        _prepare_tag(args, words)


def _prepare_tag(args: argparse.Namespace, words: List[str]) -> None:
    if not words:
        raise ValueError("the following arguments are required: ACTION "
                         "(create NAME VERSION, delete NAME or list)")
    action, rest = words[0], words[1:]
    if action not in TAG_ACTIONS:
        raise ValueError(f"unknown action {action!r}{_hint(action, TAG_ACTIONS)}; choose "
                         "create NAME VERSION, delete NAME or list")
    wanted = {"create": 2, "delete": 1, "list": 0}[action]
    if len(rest) != wanted:
        usage = {"create": "create NAME VERSION", "delete": "delete NAME", "list": "list"}
        raise ValueError(f"tag {usage[action]}: expected {wanted} argument"
                         f"{'s' if wanted != 1 else ''} after {action!r}, got {len(rest)}")
    args.action = action
    if action in ("create", "delete"):
        args.name = check_tag(rest[0])
    if action == "create":
        if not rest[1].isdigit():
            raise ValueError(f"tag create: VERSION must be a version number, got {rest[1]!r}")
        args.version = int(rest[1])


# -- the commands --------------------------------------------------------------
def _open(args: argparse.Namespace):
    from beam_supertable.table.supertable import Supertable
    return Supertable.open(args.uri, storage_options=args.storage_options)


def _landed(result: Any, table: Any) -> int:
    """The version a write verb landed in (it returns the version or the table)."""
    if isinstance(result, int) and not isinstance(result, bool):
        return result
    return int(getattr(result, "version", table.version))


def _check_columns(table: Any, names: Sequence[str]) -> None:
    """A column the table lacks, named with the closest one (before any commit)."""
    have = list(table.schema.names)
    for name in names:
        if name not in have:
            raise ValueError(f"{table.uri}: no column {name!r}{_hint(name, have)}; the "
                             f"table's columns: {', '.join(n for n in have if n != '_id')}")


def _columns_text(fields: Sequence[Any]) -> str:
    return ", ".join(f"{f.name} ({f.type})" for f in fields)


def _add_columns(args: argparse.Namespace) -> Any:
    table = _open(args)
    version = _landed(table.add_columns(args.fields), table)
    return ({"uri": args.uri, "version": version,
             "added": [{"name": f.name, "type": str(f.type)} for f in args.fields]},
            f"{args.uri}: added {_columns_text(args.fields)} in version {version}")


def _drop_columns(args: argparse.Namespace) -> Any:
    table = _open(args)
    _check_columns(table, args.names)
    version = _landed(table.drop_columns(args.names), table)
    return ({"uri": args.uri, "version": version, "dropped": list(args.names)},
            f"{args.uri}: dropped {', '.join(args.names)} in version {version}")


def _rename_column(args: argparse.Namespace) -> Any:
    table = _open(args)
    _check_columns(table, [args.old])
    version = _landed(table.rename_column(args.old, args.new), table)
    return ({"uri": args.uri, "version": version, "renamed": {args.old: args.new}},
            f"{args.uri}: renamed {args.old} to {args.new} in version {version}")


def _restore(args: argparse.Namespace) -> Any:
    table = _open(args)
    source = table.tags.get_version(args.version) if isinstance(args.version, str) \
        else args.version
    version = _landed(table.restore(source), table)
    named = f" (tag {args.version})" if isinstance(args.version, str) else ""
    return ({"uri": args.uri, "version": version, "restored": source,
             "tag": args.version if named else None},
            f"{args.uri}: restored version {source}{named} as version {version}")


def _tag(args: argparse.Namespace) -> Any:
    table = _open(args)
    tags = table.tags
    if args.action == "create":
        tags.create(args.name, args.version)
        return ({"uri": args.uri, "created": args.name, "version": args.version},
                f"{args.uri}: tagged version {args.version} as {args.name}")
    if args.action == "delete":
        was = tags.get_version(args.name)
        tags.delete(args.name)
        return ({"uri": args.uri, "deleted": args.name, "version": was},
                f"{args.uri}: deleted tag {args.name} (it named version {was})")
    listed: Dict[str, int] = tags.list()
    if not listed:
        return {"uri": args.uri, "tags": {}}, f"{args.uri}: no tags"
    width = max(len(n) for n in listed)
    lines = [f"{args.uri}: {len(listed)} tag{'s' if len(listed) != 1 else ''}"]
    lines += [f"  {name:<{width}}  version {version}" for name, version in listed.items()]
    return {"uri": args.uri, "tags": listed}, "\n".join(lines)


COMMANDS = {"add-columns": _add_columns, "drop-columns": _drop_columns,
            "rename-column": _rename_column, "restore": _restore, "tag": _tag}

"""Dataflow Flex Template metadata of each job, generated from the job's own parser.

``beam-supertable template-spec <job>`` prints the document ``gcloud dataflow
flex-template build ... --metadata-file`` takes: the job's ``name`` (its console
script), a ``description`` (the first paragraph of its help), and one entry of
``parameters`` per flag of the job, each with ``name`` (the flag as
``--name=value`` takes it), ``label``, ``helpText`` (the flag's ``--help`` line,
with its default), ``isOptional`` (False for a required flag), a
``paramType`` (``BOOLEAN`` for a switch, ``ENUM`` with ``enumOptions`` for a
flag with choices, ``NUMBER`` for a count, ``TEXT`` otherwise) and ``regexes``
where the flag's value has a format. Read from the parser each time, the
spec cannot drift from the flags.

A template passes every parameter as ``--name=value``; the jobs take a switch
that way too (``--dry_run=true``, see :func:`beam_supertable.jobs.options.parse`).
Beam's pipeline options (``--runner`` ...) are the template launcher's, not
parameters of the spec.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from beam_supertable.jobs._launch import quiet_logging

__all__ = ["JOBS", "job_module", "main", "template_spec"]

# Console script -> job module (beam_supertable.jobs.<module>); pyproject.toml's scripts.
JOBS = {
    "beam-supertable-upsert": "upsert_to_supertable",
    "beam-supertable-load": "load_supertable",
    "beam-supertable-search": "search_supertable",
    "beam-supertable-optimize": "optimize_supertable",
    "beam-upsert-changes": "upsert_changes",
}
SKIPPED = ("help", "version")   # argparse's own actions: no value a template could pass

_NAME = re.compile(r"--([a-z][a-z0-9_]*)")
# Each takes what the flag's type takes (surrounding blanks too) and refuses what it
# refuses where a regex can tell: a count of 0, a byte size of 0, a share over 100%.
_COUNT = r"^\s*\+?0*[1-9][0-9]*\s*$"
_NUMBER = r"^\s*[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"
_BYTES = r"^\s*0*[1-9][0-9]*\s*([kKmMgGtT][iI]?[bB]|[bB])?\s*$"
_MAX_INVALID = r"^\s*[0-9]+\s*$|^\s*(0*100(\.0+)?|0*[0-9]{1,2}(\.[0-9]+)?)\s*%\s*$"
_JSON_OBJECT = r"^\s*\{[\s\S]*\}\s*$"   # over several lines too
_BOOLEAN = r"^(true|false)$"


def _formats() -> Dict[Callable, tuple]:
    """A flag type -> (paramType, regex) of the values it takes."""
    from beam_supertable.jobs import options
    return {
        options.positive_int: ("NUMBER", _COUNT),
        options.byte_size: ("TEXT", _BYTES),
        options._max_invalid_type: ("TEXT", _MAX_INVALID),  # noqa: SLF001 - the flag's type
        float: ("NUMBER", _NUMBER),
        int: ("NUMBER", r"^\s*[-+]?[0-9]+\s*$"),
    }


def job_module(job: str) -> str:
    """The job module of a console script or module name; ValueError naming the jobs."""
    if job in JOBS:
        return JOBS[job]
    if job in JOBS.values():
        return job
    raise ValueError(f"{job!r}: not a job; the jobs are {', '.join(JOBS)} (or their modules "
                     f"{', '.join(JOBS.values())})")


def _parser(module: str) -> argparse.ArgumentParser:
    return importlib.import_module(f"beam_supertable.jobs.{module}").build_parser()


def _name(action: argparse.Action) -> str:
    """The flag's snake_case spelling (every job flag has one): ``dry_run``."""
    for option in action.option_strings:
        match = _NAME.fullmatch(option)
        if match:
            return match.group(1)
    raise ValueError(f"flag {'/'.join(action.option_strings)} has no --snake_case spelling a "
                     "template parameter could use")


def _label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()  # noqa: SLF001 - the job's own help text and defaults
    text = formatter._expand_help(action) if action.help else ""  # noqa: SLF001
    return " ".join(text.split()) or _label(_name(action))


def _parameter(parser: argparse.ArgumentParser, action: argparse.Action,
               formats: Dict[Callable, tuple]) -> Dict[str, Any]:
    name = _name(action)
    out: Dict[str, Any] = {"name": name, "label": _label(name),
                           "helpText": _help(parser, action),
                           "isOptional": not action.required}
    if isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
        out.update(paramType="BOOLEAN", regexes=[_BOOLEAN])
    elif action.choices:
        values = [str(c) for c in action.choices]
        out.update(paramType="ENUM", enumOptions=[{"value": v, "label": v} for v in values],
                   regexes=["^(" + "|".join(re.escape(v) for v in values) + ")$"])
    elif action.type in formats:
        kind, regex = formats[action.type]
        out.update(paramType=kind, regexes=[regex])
    elif action.dest == "storage_options":
        out.update(paramType="TEXT", regexes=[_JSON_OBJECT])
    else:
        out["paramType"] = "TEXT"
    return out


def parameter_actions(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    """The flags of a job's parser a template passes: all but --help and --version."""
    return [a for a in parser._actions  # noqa: SLF001
            if a.option_strings and a.dest not in SKIPPED]


def template_spec(job: str) -> Dict[str, Any]:
    """The Flex Template metadata of ``job`` (a console script or a job module name)."""
    module = job_module(job)
    script = next(s for s, m in JOBS.items() if m == module)
    parser = _parser(module)
    paragraphs = (parser.description or "").strip().split("\n\n")
    formats = _formats()
    return {"name": script,
            "description": " ".join(paragraphs[0].split()),
            "parameters": [_parameter(parser, a, formats) for a in parameter_actions(parser)]}


def main(argv: Optional[Sequence[str]] = None, prog: str = "beam-supertable template-spec") -> int:
    """Prints ``template_spec(job)`` as JSON; exit 2 naming the jobs for an unknown one."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: {prog} JOB\n{prog}: error: name one job: {', '.join(JOBS)}",
              file=sys.stderr)
        return 2
    quiet_logging()   # before the job imports apache-beam: its import-time messages
    try:
        spec = template_spec(args[0])
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(spec, indent=2))
    return 0

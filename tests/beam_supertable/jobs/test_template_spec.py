"""Each job's Dataflow Flex Template metadata against the job's own parser.

The spec is generated from the parser, so these tests hold it to the parser
independently (every flag a parameter, required flags not optional, choices
and switches typed) and to the metadata format (the fields Dataflow's
``ParameterMetadata`` requires, valid regexes, names a template can pass), and
pass a whole template's parameters, as ``--name=value``, back through the job's
parsing.
"""

import argparse
import json
import re
import subprocess
import sys

import pytest

from beam_supertable.jobs import options
from beam_supertable.jobs.template_spec import JOBS, job_module, template_spec

PARAM_TYPES = {"DEFAULT", "TEXT", "BOOLEAN", "NUMBER", "ENUM", "GCS_READ_FILE",
               "GCS_WRITE_FILE", "GCS_READ_FOLDER", "GCS_WRITE_FOLDER"}
# A value of each format a parameter may declare, and one none of them takes.
SAMPLES = ["12", "64MiB", "5%", "1.5", "true", "{}"]
BAD = "twelve"


def parser_of(job):
    module = __import__(f"beam_supertable.jobs.{job_module(job)}", fromlist=["build_parser"])
    return module.build_parser()


def flags(parser):
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, (argparse._HelpAction,
                                                       argparse._VersionAction))]


@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_spec_has_one_parameter_per_flag_in_the_metadata_format(job):
    spec = template_spec(job)
    parser = parser_of(job)
    assert spec["name"] == job and isinstance(spec["description"], str) and spec["description"]
    params = spec["parameters"]
    by_name = {p["name"]: p for p in params}
    assert len(by_name) == len(params), "parameter names repeat"
    for p in params:
        assert {"name", "label", "helpText", "isOptional"} <= set(p), p
        assert re.fullmatch(r"[a-z][a-z0-9_]*", p["name"]), p["name"]
        assert isinstance(p["label"], str) and p["label"].strip()
        assert isinstance(p["helpText"], str) and p["helpText"].strip()
        assert isinstance(p["isOptional"], bool)
        assert p.get("paramType", "TEXT") in PARAM_TYPES
        for regex in p.get("regexes", []):
            re.compile(regex)
            assert not re.fullmatch(regex, BAD), (p["name"], regex)
    assert len(params) == len(flags(parser))
    for action in flags(parser):
        (param,) = [by_name[s[2:]] for s in action.option_strings if s[2:] in by_name]
        assert param["isOptional"] is (not action.required), param
        if isinstance(action, argparse._StoreTrueAction):
            assert param["paramType"] == "BOOLEAN"
        if action.choices:
            assert param["paramType"] == "ENUM"
            assert [o["value"] for o in param["enumOptions"]] == [str(c) for c in action.choices]
        if action.type is not None and action.type is not str:
            # A flag with a format says it; what its regex takes, its type takes.
            (regex,) = param["regexes"]
            taken = [s for s in SAMPLES if re.fullmatch(regex, s)]
            assert taken, (param["name"], regex)
            for sample in taken:
                action.type(sample)
            if action.default is not None:
                assert re.fullmatch(regex, str(action.default)), (param["name"], action.default)
        if action.default not in (None, False) and action.help:
            assert str(action.default) in param["helpText"] or "default" in param["helpText"]


def _value(param):
    if param.get("paramType") == "ENUM":
        return param["enumOptions"][-1]["value"]
    for regex in param.get("regexes", []):
        return next(s for s in SAMPLES if re.fullmatch(regex, s))
    return "x"


@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_parameter_of_a_template_parses_as_the_template_passes_it(job):
    spec = template_spec(job)
    argv = [f"--{p['name']}={_value(p)}" for p in spec["parameters"]
            if p["name"] not in ("verbose", "debug")]
    _, args = options.parse(parser_of(job), argv)
    for p in spec["parameters"]:
        if p.get("paramType") == "BOOLEAN" and p["name"] not in ("verbose", "debug"):
            assert getattr(args, p["name"]) is True   # passed as --name=true


def test_a_switch_takes_true_or_false_as_a_template_passes_it(capsys):
    parser = parser_of("beam-supertable-optimize")
    assert options.parse(parser, ["--table=t", "--dry_run=true"])[1].dry_run is True
    assert options.parse(parser, ["--table=t", "--dry_run=FALSE"])[1].dry_run is False
    with pytest.raises(SystemExit) as exited:
        options.parse(parser, ["--table=t", "--dry_run=maybe"])
    assert exited.value.code == 2
    assert "--dry_run: a switch; give it alone, or ='maybe' as true or false" in \
        capsys.readouterr().err


def test_the_command_line_prints_the_spec_and_names_the_jobs_for_an_unknown_one():
    done = subprocess.run([sys.executable, "-m", "beam_supertable", "template-spec",
                           "beam-supertable-load"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == template_spec("load_supertable")
    assert done.stderr == ""
    done = subprocess.run([sys.executable, "-m", "beam_supertable", "template-spec", "loader"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "python -m beam_supertable template-spec: error: 'loader': not a job; the jobs are "
        + ", ".join(JOBS) + " (or their modules " + ", ".join(JOBS.values()) + ")"]


# Values a user (or a template's form) gives: each regex takes exactly what its flag takes.
VALUES = ["5", "05", "+5", " 5 ", "0", "-1", "64MiB", "64 mib", " 64MiB", "0B", "1e3", ".5",
          "5.", "1.5", "5%", "5 %", "100%", "100.0%", "200%", "0.5%", "twelve", "",
          '{"a": 1}', '{\n  "a": 1\n}', " {} ", "[1]"]


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_parameter_regex_takes_exactly_the_values_its_flag_takes(job):
    spec = {p["name"]: p for p in template_spec(job)["parameters"]}
    for action in flags(parser_of(job)):
        param = spec[next(s[2:] for s in action.option_strings if s[2:] in spec)]
        if action.dest == "storage_options":
            def accepts(value):
                if not isinstance(json.loads(value), dict):
                    raise ValueError(value)
        elif action.type is not None and action.type is not str and not action.choices:
            accepts = action.type
        else:
            continue
        (regex,) = param["regexes"]
        for value in VALUES:
            try:
                accepts(value)
                taken = True
            except (ValueError, argparse.ArgumentTypeError):
                taken = False
            assert bool(re.fullmatch(regex, value)) is taken, (param["name"], value, regex)

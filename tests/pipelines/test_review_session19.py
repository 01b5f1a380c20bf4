"""Review of session 19: ``--environment_cache_millis`` chosen by the user is kept.

``fill_defaults`` keeps a job's SDK workers for ``ENVIRONMENT_CACHE_MS``
unless the user chose a value, however the options were built: flags, a
dictionary, keyword arguments (no Flink runtime needed).
"""

import pytest
from apache_beam.options.pipeline_options import (FlinkRunnerOptions, PipelineOptions,
                                                  PortableOptions)

from pipelines import flink


@pytest.fixture(autouse=True)
def _jar(monkeypatch):
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, "/opt/js.jar")


def _cache(options):
    return int(options.view_as(PortableOptions).environment_cache_millis)


@pytest.mark.parametrize("build", [
    lambda v: PipelineOptions(["--runner=FlinkRunner"], environment_cache_millis=v),
    lambda v: PipelineOptions.from_dictionary({"runner": "FlinkRunner",
                                               "environment_cache_millis": v}),
    lambda v: PipelineOptions(runner="FlinkRunner", environment_cache_millis=v),
], ids=["flags+kwargs", "from_dictionary", "kwargs"])
@pytest.mark.parametrize("value", [5_000, 1])
def test_a_value_given_in_an_options_object_is_kept(build, value):
    # An options object carries no argv: the value it holds is the user's.
    assert _cache(flink.fill_defaults(build(value), [])) == value


def test_a_zero_given_as_a_string_in_a_dictionary_is_kept():
    options = PipelineOptions.from_dictionary({"runner": "FlinkRunner",
                                               "environment_cache_millis": 0})
    assert _cache(flink.fill_defaults(options, [])) == 0


@pytest.mark.parametrize("argv", [
    ["--runner=FlinkRunner", "--environment_cache_millis=0"],
    ["--runner=FlinkRunner", "--environment_cache_millis", "0"],
])
def test_zero_on_the_command_line_is_kept(argv):
    assert _cache(flink.fill_defaults(PipelineOptions(argv), argv)) == 0


def test_unset_gets_the_projects_default_whether_argv_is_given_or_not():
    argv = ["--runner=FlinkRunner"]
    assert _cache(flink.fill_defaults(PipelineOptions(argv), argv)) == flink.ENVIRONMENT_CACHE_MS
    assert _cache(flink.fill_defaults(PipelineOptions(argv))) == flink.ENVIRONMENT_CACHE_MS


def test_a_job_endpoint_with_a_flink_master_keeps_both_and_needs_no_jar():
    argv = ["--runner=FlinkRunner", "--flink_master=localhost:8081",
            "--job_endpoint=localhost:8099", "--environment_cache_millis=0"]
    options = flink.fill_defaults(PipelineOptions(argv), argv)
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar is None
    assert options.view_as(FlinkRunnerOptions).flink_master == "localhost:8081"
    assert options.view_as(PortableOptions).job_endpoint == "localhost:8099"
    assert _cache(options) == 0

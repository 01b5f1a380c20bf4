"""beam_supertable.jobs.flink option handling (no Flink runtime needed)."""

import pytest
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions, PipelineOptions, PortableOptions)

from beam_supertable.jobs import flink
from beam_supertable.jobs.options import parse
from beam_supertable.jobs.upsert_changes import build_parser


def test_flink_runner_gets_the_local_job_server_and_keeps_the_job_output(monkeypatch, tmp_path):
    jar = tmp_path / "job-server.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, str(jar))
    argv = ["--runner=FlinkRunner", "--output", "out/changes.jsonl"]
    options, job = parse(build_parser(), argv)
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar == str(jar)
    assert options.view_as(FlinkRunnerOptions).flink_version == flink.FLINK_VERSION
    # --output must stay the job's, not become an abbreviated --output_executable_path.
    assert options.view_as(PortableOptions).output_executable_path is None
    assert job.output == "out/changes.jsonl"


def test_explicit_choices_are_kept(monkeypatch):
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, "/nonexistent/should-not-be-used.jar")
    argv = ["--runner=FlinkRunner", "--flink_job_server_jar=/opt/beam/js.jar",
            "--output_executable_path=/tmp/pipeline.jar"]
    options = flink.fill_defaults(PipelineOptions(argv), argv)
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar == "/opt/beam/js.jar"
    assert options.view_as(PortableOptions).output_executable_path == "/tmp/pipeline.jar"


def test_other_runners_are_left_alone(monkeypatch):
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, "/nonexistent/should-not-be-used.jar")
    options = flink.fill_defaults(PipelineOptions(["--output", "x.jsonl"]), ["--output", "x.jsonl"])
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar is None


def test_flink_options_for_an_embedded_cluster(monkeypatch):
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, "/opt/js.jar")
    options = flink.flink_options(2, "[local]")
    assert options.view_as(FlinkRunnerOptions).parallelism == 2
    assert options.view_as(FlinkRunnerOptions).flink_master == "[local]"
    assert options.view_as(PortableOptions).environment_type == "LOOPBACK"


def test_the_job_server_release_is_one_constant():
    # The POM's <beam.version> names the Flink-matched Beam; a release string.
    assert flink.job_server_beam_version().count(".") == 2


def test_sdk_workers_are_kept_between_the_stages_of_a_job(monkeypatch):
    # Beam's default (0) closes a job's SDK workers whenever no task holds
    # them: between the pipelined regions of a batch job they were started
    # afresh for every region.
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, "/opt/js.jar")
    options = flink.flink_options(2, "[local]")
    assert options.view_as(PortableOptions).environment_cache_millis == flink.ENVIRONMENT_CACHE_MS
    assert flink.ENVIRONMENT_CACHE_MS >= 10_000
    argv = ["--runner=FlinkRunner", "--environment_cache_millis=0"]
    options = flink.fill_defaults(PipelineOptions(argv), argv)
    assert int(options.view_as(PortableOptions).environment_cache_millis) == 0


def test_a_running_job_server_needs_no_jar(monkeypatch):
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, "/nonexistent/should-not-be-used.jar")
    argv = ["--runner=FlinkRunner", "--job_endpoint=localhost:8099"]
    options = flink.fill_defaults(PipelineOptions(argv), argv)
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar is None
    assert options.view_as(PortableOptions).job_endpoint == "localhost:8099"


# -- --environment_cache_millis chosen by the user is kept, however options are built --
@pytest.fixture
def _jar(monkeypatch):
    monkeypatch.setenv(flink.JOB_SERVER_JAR_ENV, "/opt/js.jar")


def _cache(options):
    return int(options.view_as(PortableOptions).environment_cache_millis)


@pytest.mark.usefixtures("_jar")
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


@pytest.mark.usefixtures("_jar")
def test_a_zero_given_as_a_string_in_a_dictionary_is_kept():
    options = PipelineOptions.from_dictionary({"runner": "FlinkRunner",
                                               "environment_cache_millis": 0})
    assert _cache(flink.fill_defaults(options, [])) == 0


@pytest.mark.usefixtures("_jar")
@pytest.mark.parametrize("argv", [
    ["--runner=FlinkRunner", "--environment_cache_millis=0"],
    ["--runner=FlinkRunner", "--environment_cache_millis", "0"],
])
def test_zero_on_the_command_line_is_kept(argv):
    assert _cache(flink.fill_defaults(PipelineOptions(argv), argv)) == 0


@pytest.mark.usefixtures("_jar")
def test_unset_gets_the_projects_default_whether_argv_is_given_or_not():
    argv = ["--runner=FlinkRunner"]
    assert _cache(flink.fill_defaults(PipelineOptions(argv), argv)) == flink.ENVIRONMENT_CACHE_MS
    assert _cache(flink.fill_defaults(PipelineOptions(argv))) == flink.ENVIRONMENT_CACHE_MS


@pytest.mark.usefixtures("_jar")
def test_a_job_endpoint_with_a_flink_master_keeps_both_and_needs_no_jar():
    argv = ["--runner=FlinkRunner", "--flink_master=localhost:8081",
            "--job_endpoint=localhost:8099", "--environment_cache_millis=0"]
    options = flink.fill_defaults(PipelineOptions(argv), argv)
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar is None
    assert options.view_as(FlinkRunnerOptions).flink_master == "localhost:8081"
    assert options.view_as(PortableOptions).job_endpoint == "localhost:8099"
    assert _cache(options) == 0

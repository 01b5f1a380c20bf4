"""Beam YAML pipelines over supertables, from the shipped ``providers.yaml``.

The pipelines are real YAML files run by ``python -m apache_beam.yaml.main`` in
a subprocess on the DirectRunner: the example of docs/guides/beam-yaml.md
writes a table (one row rejected onto ``error_handling``'s output) and upserts
commands into a keyed table; ``yaml_pipelines/follow_up.yaml`` reads, searches
and follows them and upserts a second batch (offsets, deletes, a refused
command); ``yaml_pipelines/checked.yaml`` carries Beam YAML's inline tests,
run as ``main --tests`` runs them. The inline tests, the failure without
``error_handling`` and the construction errors run in-process, where they
cost no interpreter start.
"""

import glob
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from beam_supertable import Supertable
from beam_supertable.yaml import PROVIDERS, TRANSFORMS

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIPELINES = pathlib.Path(__file__).resolve().parent / "yaml_pipelines"
GUIDE = ROOT / "docs" / "guides" / "beam-yaml.md"

# Beam YAML imports its own extras (apache-beam[yaml]); the test extra names them.
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("docstring_parser", "jinja2", "pandas")),
    reason="Beam YAML needs apache-beam[yaml] (pip install -e '.[test]')")


def guide_pipeline() -> str:
    """The first YAML block of the guide: the pipeline a reader runs first."""
    return re.search(r"```yaml\n(.*?)```", GUIDE.read_text(), re.S).group(1)


def run_yaml(pipeline: pathlib.Path, out: pathlib.Path, *extra: str):
    variables = json.dumps({"providers": PROVIDERS, "out": str(out)})
    return subprocess.run(
        [sys.executable, "-m", "apache_beam.yaml.main", f"--yaml_pipeline_file={pipeline}",
         f"--jinja_variables={variables}", *extra],
        capture_output=True, text=True, timeout=600, cwd=out)


def lines(out: pathlib.Path, name: str):
    found = []
    for path in sorted(glob.glob(str(out / name) + "*")):
        with open(path) as f:
            found.extend(json.loads(line) for line in f if line.strip())
    return found


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The guide's pipeline, run once: the tables the other tests read."""
    out = tmp_path_factory.mktemp("yaml")
    pipeline = out / "pipeline.yaml"
    pipeline.write_text(guide_pipeline())
    done = run_yaml(pipeline, out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_shipped_provider_file_names_every_transform():
    import yaml

    assert os.path.isfile(PROVIDERS)
    (provider,) = yaml.safe_load(pathlib.Path(PROVIDERS).read_text())
    assert provider["type"] == "python" and "packages" not in provider.get("config", {})
    assert provider["transforms"] == TRANSFORMS
    # The guide's written-out form is the same block.
    assert all(f"{name}: {target}" in GUIDE.read_text() for name, target in TRANSFORMS.items())
    done = subprocess.run([sys.executable, "-m", "beam_supertable.yaml"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == PROVIDERS


def test_the_guide_pipeline_then_a_second_one_reading_searching_and_upserting(written):
    # One test, in order: the second pipeline changes the keyed table the first wrote.
    docs = Supertable.open(str(written / "docs"))
    assert sorted(r["id"] for r in docs.to_arrow().to_pylist()) == [1, 2, 3]
    assert [str(f.type) for f in docs.user_schema] == [
        "int64", "string", "double", "fixed_size_list<item: float>[4]"]
    assert lines(written, "commits.json") == [
        {"version": 1, "rows": 3, "superfiles": 1, "deduplicated": False}]
    (rejected,) = lines(written, "rejected.json")
    assert rejected["element"] == {"id": 4, "topic": "too short", "v": 4.5, "emb": [0.9, 0.2]}
    assert rejected["msg"] == "row with id 4: column 'emb' expects 4 float32 values, got 2"
    sensors = Supertable.open(str(written / "sensors"))
    assert sensors.primary_key == ["sensor"]
    assert sensors.user_schema.names == ["sensor", "reading", "t"]   # not seq, gone
    assert sensors.frontier == 10_000_001

    done = run_yaml(PIPELINES / "follow_up.yaml", written)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(lines(written, "read.json"), key=lambda r: r["id"]) == [
        {"id": 2, "topic": "sea", "v": 2.5}, {"id": 3, "topic": "space rocks", "v": 3.5}]
    (found,) = lines(written, "search.json")
    assert found["q"] == 1 and [r["id"] for r in found["results"]] == [3, 2]
    assert found["results"][0]["distance"] == pytest.approx(0.0, abs=1e-6)
    (unsearchable,) = lines(written, "unsearchable.json")
    assert unsearchable["element"] == {"q": 2, "vec": [0.9, 0.2]}
    assert "query vector(s) must have 4 values" in unsearchable["msg"]
    # The feed as of the version the pipeline was built on: the first batch.
    assert sorted((c["sensor"], c["reading"], c["diff"])
                  for c in lines(written, "changes.json")) == [
        ("a", 1, 1), ("b", 2, 1), ("c", 3, 1)]
    # Per key at one time the greatest offset wins: a -> 11; b deleted; c's
    # delete (offset 5) beats its put (offset 4); d is new; e has no offset.
    table = Supertable.open(str(written / "sensors"))
    assert sorted((r["sensor"], r["reading"]) for r in table.to_arrow().to_pylist()) == [
        ("a", 11), ("d", 4)]
    assert table.frontier == 20_000_001
    (refused,) = lines(written, "refused.json")
    assert refused["element"] == {"sensor": "e", "reading": 5, "seq": None, "t": 20,
                                  "gone": False}
    assert refused["msg"].endswith("offset field 'seq' is null")
    assert [c["version"] for c in lines(written, "upsert-commits.json")] == [2]
    # The second batch in the change feed: retractions and insertions at its commit.
    expand(f"""
pipeline:
  type: chain
  transforms:
    - type: ReadChangesFromSupertable
      config: {{uri: {written}/sensors, start_version: 1, end_version: latest}}
    - type: WriteToJson
      config: {{path: {written}/changes-2.json}}
providers:
  - include: PROVIDERS
""", written)
    assert sorted((c["sensor"], c["reading"], c["diff"])
                  for c in lines(written, "changes-2.json")) == [
        ("a", 1, -1), ("a", 11, 1), ("b", 2, -1), ("c", 3, -1), ("d", 4, 1)]


def test_the_pipeline_file_inline_tests_pass_on_the_written_table(written):
    testing = pytest.importorskip("apache_beam.yaml.yaml_testing",
                                  reason="this apache-beam runs no inline YAML tests")
    import jinja2
    import yaml
    from apache_beam.yaml.yaml_utils import SafeLineLoader

    # What ``main --tests`` does with the file, in this process: fill in the
    # template variables, then run each test of its ``tests:`` block.
    text = jinja2.Template((PIPELINES / "checked.yaml").read_text()).render(
        providers=PROVIDERS, out=str(written))
    spec = yaml.load(text, Loader=SafeLineLoader)
    (test,) = spec["tests"]
    testing.run_test(spec, test)
    broken = dict(test, expected_inputs=[dict(test["expected_inputs"][0], elements=[
        {"id": 2, "topic": "sea"}])])
    with pytest.raises(Exception):   # the check can fail: a row too many
        testing.run_test(spec, broken)
    # The guide's tests block, appended to the guide's reading pipeline as it says.
    blocks = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.S)
    reading = next(b for b in blocks if "type: ReadFromSupertable" in b)
    guide_tests = next(b for b in blocks if b.startswith("tests:"))
    text = jinja2.Template(reading.replace("/tmp/yaml-demo", str(written)) + guide_tests
                           ).render(providers=PROVIDERS)
    spec = yaml.load(text, Loader=SafeLineLoader)
    (test,) = spec["tests"]
    testing.run_test(spec, test)


# -- in-process: failures ------------------------------------------------------------
def expand(spec: str, tmp_path):
    import apache_beam as beam
    from apache_beam.yaml.yaml_transform import expand_pipeline

    text = spec.replace("OUT", str(tmp_path)).replace("PROVIDERS", PROVIDERS)
    with beam.Pipeline("DirectRunner") as p:
        expand_pipeline(p, text)


ROWS = """
pipeline:
  type: chain
  transforms:
    - type: Create
      config:
        elements:
          - {id: 1, emb: [0.1, 0.2]}
          - {id: 2, emb: [0.1]}
    - type: WriteToSupertable
      config: CONFIG
providers:
  - include: PROVIDERS
"""


def test_without_error_handling_a_rejected_row_fails_the_pipeline_naming_it(tmp_path):
    with pytest.raises(Exception, match=r"row with id 2: column 'emb' expects 2 float32 "
                                        r"values, got 1 \(route rejected rows with "
                                        r"error_handling"):
        expand(ROWS.replace("CONFIG", "{uri: OUT/t, vector_column: emb, vector_dim: 2}"),
               tmp_path)
    # The rejected row failed its bundle before anything was committed.
    assert not os.path.exists(tmp_path / "t") \
        or Supertable.open(str(tmp_path / "t")).to_arrow().num_rows == 0


@pytest.mark.parametrize("config, message", [
    ("{uri: OUT/t, vector_column: emb}",
     "vector column 'emb' needs the vectors' length, which a Beam schema does not carry: "
     "add vector_dim: N"),
    ("{uri: ' ', vector_column: emb}", "WriteToSupertable: uri must name a table, got ' '"),
    ("{uri: OUT/t, vector_column: emb, vector_dim: 0}",
     "WriteToSupertable: vector_dim must be a positive int, got 0"),
    ("{uri: OUT/afile/t}", "WriteToSupertable: uri OUT/afile/t: OUT/afile is a file, so no "
                           "table can be inside it"),
    ("{uri: OUT/t, storage_options: {nosuch_option: 1}}",
     "WriteToSupertable: storage_options: 'nosuch_option' is not an option of a local table"),
])
def test_a_config_mistake_fails_while_the_pipeline_is_built(tmp_path, config, message):
    (tmp_path / "afile").write_text("x")
    message = message.replace("OUT", str(tmp_path))
    with pytest.raises(ValueError, match=re.escape(message)):
        expand(ROWS.replace("CONFIG", config), tmp_path)
    assert not os.path.exists(tmp_path / "t")


def test_reads_refuse_a_bad_filter_and_an_unknown_column(written, tmp_path):
    source = """
pipeline:
  type: chain
  transforms:
    - type: ReadFromSupertable
      config: CONFIG
    - type: LogForTesting
providers:
  - include: PROVIDERS
"""
    docs = written / "docs"
    with pytest.raises(ValueError, match="ReadFromSupertable: filter: cannot read 'v >>> 2'"):
        expand(source.replace("CONFIG", f"{{uri: {docs}, filter: 'v >>> 2'}}"), tmp_path)
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['nope'\]"):
        expand(source.replace("CONFIG", f"{{uri: {docs}, columns: [nope]}}"), tmp_path)


# -- on Flink ---------------------------------------------------------------------------
@pytest.mark.flink
def test_a_yaml_pipeline_writes_and_rejects_on_flink(tmp_path):
    """The write with its error output, through ``apache_beam.yaml.main`` on FlinkRunner.

    Only transforms every Beam YAML release this project supports has (the Flink
    environment's apache-beam is older than the default one).
    """
    from beam_supertable.jobs import flink

    pipeline = tmp_path / "flink.yaml"
    pipeline.write_text("""
pipeline:
  transforms:
    - name: Docs
      type: Create
      config:
        elements:
          - {id: 1, topic: space, emb: [0.1, 0.2, 0.3, 0.4]}
          - {id: 2, topic: sea, emb: [0.4, 0.3, 0.2, 0.1]}
          - {id: 3, topic: rocks, emb: [0.9, 0.2, 0.3, 0.4]}
          - {id: 4, topic: too short, emb: [0.9]}
    - name: Write
      type: WriteToSupertable
      input: Docs
      config:
        uri: "{{ out }}/docs"
        vector_column: emb
        vector_dim: 4
        error_handling: {output: rejected}
    - name: Rejected
      type: WriteToJson
      input: Write.rejected
      config: {path: "{{ out }}/rejected.json"}
    - name: Commits
      type: WriteToJson
      input: Write
      config: {path: "{{ out }}/commits.json"}
providers:
  - include: "{{ providers }}"
""")
    done = run_yaml(pipeline, tmp_path, "--runner=FlinkRunner", "--flink_master=[local]",
                    f"--flink_version={flink.FLINK_VERSION}", "--parallelism=2",
                    "--environment_type=LOOPBACK",
                    f"--environment_cache_millis={flink.ENVIRONMENT_CACHE_MS}",
                    f"--flink_job_server_jar={flink.job_server_jar()}")
    assert done.returncode == 0, done.stderr[-3000:]
    table = Supertable.open(str(tmp_path / "docs"))
    assert sorted(r["id"] for r in table.to_arrow().to_pylist()) == [1, 2, 3]
    assert [c["rows"] for c in lines(tmp_path, "commits.json")] == [3]
    (rejected,) = lines(tmp_path, "rejected.json")
    assert rejected["element"]["id"] == 4
    assert rejected["msg"] == "row with id 4: column 'emb' expects 4 float32 values, got 1"


def test_reads_give_each_column_type_and_a_hybrid_search_ranks_by_its_fused_score(tmp_path):
    """Timestamps (as pyarrow gives them, in its own UTC), int32, bool, large strings
    and nulls read back as Rows; a filter is checked against the table's types while
    the pipeline is built; the guide's written-out provider block loads the transforms."""
    import datetime

    import pyarrow as pa

    utc = datetime.timezone.utc
    schema = pa.schema([("id", pa.int32()), ("ts", pa.timestamp("us", tz="UTC")),
                        ("ok", pa.bool_()), ("txt", pa.large_string()),
                        ("emb", pa.list_(pa.float32(), 2)), ("d", pa.date32())])
    table = Supertable.create(str(tmp_path / "typed"), schema=schema, vector_column="emb",
                              fts_columns=["txt"])
    table.append(pa.table({
        "id": pa.array([1, 2, 3], pa.int32()),
        "ts": pa.array([datetime.datetime(2024, 1, 1, tzinfo=utc), None,
                        datetime.datetime(2025, 6, 1, 12, 0, 0, 5, tzinfo=utc)],
                       pa.timestamp("us", tz="UTC")),
        "ok": [True, None, False], "txt": pa.array(["alpha beta", "gamma", None],
                                                   pa.large_string()),
        "emb": pa.array([[0.1, 0.2], [0.4, 0.3], [0.9, 0.2]], pa.list_(pa.float32(), 2)),
        "d": pa.array([datetime.date(2024, 2, 29), None, None], pa.date32())},
        schema=schema))
    block = re.search(r"```yaml\n(providers:\n  - type: python\n.*?)```", GUIDE.read_text(),
                      re.S).group(1)
    expand(f"""
pipeline:
  transforms:
    - name: Read
      type: ReadFromSupertable
      config: {{uri: OUT/typed, columns: [id, ts, ok, txt, d], filter: "id >= 1"}}
    - name: Plain
      type: MapToFields
      input: Read
      config:
        language: python
        fields: {{id: id, ts: "str(ts.to_rfc3339()) if ts else None", ok: ok, txt: txt,
                  d: "str(d) if d else None"}}
    - name: ReadOut
      type: WriteToJson
      input: Plain
      config: {{path: OUT/read.json}}
    - name: Questions
      type: Create
      config:
        elements: [{{q: 1, vec: [0.9, 0.2], words: alpha}}]
    - name: Search
      type: SearchSupertable
      input: Questions
      config: {{uri: OUT/typed, vector_field: vec, text_field: words, k: 3, columns: [id]}}
    - name: SearchOut
      type: WriteToJson
      input: Search
      config: {{path: OUT/search.json}}
    - name: Timed
      type: ReadFromSupertable
      config: {{uri: OUT/typed, columns: [id, ts, emb]}}
    - name: Copy
      type: WriteToSupertable
      input: Timed
      config: {{uri: OUT/copy, vector_column: emb, vector_dim: 3, error_handling: {{output: bad}}}}
    - name: Self
      type: SearchSupertable
      input: Timed
      config: {{uri: OUT/typed, vector_field: emb, k: 1, columns: [id]}}
    - name: Passed
      type: MapToFields
      input: Self
      config:
        language: python
        fields: {{id: id, ts: "str(ts.to_rfc3339()) if ts else None", hit: "results[0].id"}}
    - name: Refused
      type: MapToFields
      input: Copy.bad
      config:
        language: python
        fields: {{id: element.id, ts: "str(element.ts.to_rfc3339()) if element.ts else None"}}
    - {{type: WriteToJson, input: Passed, config: {{path: OUT/passed.json}}}}
    - {{type: WriteToJson, input: Refused, config: {{path: OUT/refused.json}}}}
{block}""", tmp_path)
    # Rows with timestamps pass through a search and onto an error output as they came.
    times = {1: "2024-01-01T00:00:00Z", 2: None, 3: "2025-06-01T12:00:00.000005Z"}
    assert sorted(lines(tmp_path, "passed.json"), key=lambda r: r["id"]) == [
        {"id": i, "ts": t, "hit": i} for i, t in times.items()]
    assert sorted(lines(tmp_path, "refused.json"), key=lambda r: r["id"]) == [
        {"id": i, "ts": t} for i, t in times.items()]
    assert sorted(lines(tmp_path, "read.json"), key=lambda r: r["id"]) == [
        {"id": 1, "ts": "2024-01-01T00:00:00Z", "ok": True, "txt": "alpha beta",
         "d": "2024-02-29"},
        {"id": 2, "ts": None, "ok": None, "txt": "gamma", "d": None},
        {"id": 3, "ts": "2025-06-01T12:00:00.000005Z", "ok": False, "txt": None, "d": None}]
    (found,) = lines(tmp_path, "search.json")
    fused = table.search(vector=[0.9, 0.2], text="alpha", k=3, columns=["id"]).to_pylist()
    assert [(r["id"], r["score"]) for r in found["results"]] == [
        (h["id"], pytest.approx(h["_score"])) for h in fused]
    scores = [r["score"] for r in found["results"]]
    assert scores == sorted(scores, reverse=True)
    read = "{type: ReadFromSupertable, config: {uri: OUT/typed, filter: 'FILTER'}}"
    search = ("{type: SearchSupertable, input: Q, config: {uri: OUT/typed, text_field: w, "
              "filter: 'FILTER'}}")
    for transform in (read, search):
        for text, message in (("txt == 5", "filter: column 'txt' is large_string, the value 5 is "
                                           "int64; they cannot be compared"),
                              ("ts > 5", "filter: column 'ts' is timestamp"),
                              ("idd > 1", "filter: the table has no column 'idd' (did you "
                                          "mean 'id'?)")):
            with pytest.raises(ValueError, match=re.escape(message)):
                expand(f"""
pipeline:
  transforms:
    - {{name: Q, type: Create, config: {{elements: [{{w: a}}]}}}}
    - {transform.replace("FILTER", text)}
providers:
  - include: PROVIDERS
""", tmp_path)

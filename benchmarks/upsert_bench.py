"""Upsert throughput on the DirectRunner, each case against its baseline.

    python -m benchmarks.upsert_bench            # all cases, prints a table
    python -m benchmarks.upsert_bench --case grouped
    python -m benchmarks.upsert_bench --tombstones   # tombstone_retention=0 vs the default

Every case runs in its own process (so peak RSS is its own) and reads its
input from files written once under benchmarks/data/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.transforms.window import TimestampedValue

from beam_upsert import Upsert, UpsertBatches, UpsertCommand, upsert_table
from beam_upsert.grouped import GroupedUpsertFn
from beam_upsert.prepare import INVALID_TAG, PrepareCommands, PreparePrior
from beam_upsert.stateful import (
    COUNTS_TAG, DEFAULT_STATE_SHARDS, DEFAULT_TOMBSTONE_RETENTION_US, ShardKeys, StatefulUpsertFn)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
N_COMMANDS, N_KEYS, N_PRIOR, N_TIMES, DELETE_SHARE = 200_000, 50_000, 25_000, 10, 0.05
COLUMNAR_COMMANDS, COLUMNAR_BATCH_ROWS, COLUMNAR_KEYS = 2_000_000, 10_000, 500_000


def _path(name):
    return os.path.join(DATA, name)


def make_data() -> None:
    os.makedirs(DATA, exist_ok=True)
    if not os.path.exists(_path("commands.jsonl")):
        rng = random.Random(42)
        with open(_path("commands.jsonl"), "w") as f:
            for i in range(N_COMMANDS):
                value = None if rng.random() < DELETE_SHARE else rng.randrange(1000)
                f.write(json.dumps({"key": f"k{rng.randrange(N_KEYS)}", "value": value,
                                    "offset": i, "time": rng.randrange(N_TIMES)}) + "\n")
        with open(_path("prior.jsonl"), "w") as f:
            for k in rng.sample(range(N_KEYS), N_PRIOR):
                f.write(json.dumps({"key": f"k{k}", "value": rng.randrange(1000)}) + "\n")
    if not os.path.exists(_path("columnar.parquet")):
        rng = np.random.default_rng(42)
        n = COLUMNAR_COMMANDS
        values = rng.integers(0, 1000, n)
        table = pa.table({
            "key": rng.integers(0, COLUMNAR_KEYS, n),
            "value": pa.array(values, mask=rng.random(n) < DELETE_SHARE),
            "offset": np.arange(n),
            "time": rng.integers(0, N_TIMES, n) * 1_000_000,
        })
        pq.write_table(table, _path("columnar.parquet"), row_group_size=COLUMNAR_BATCH_ROWS)
        keys = rng.choice(COLUMNAR_KEYS, COLUMNAR_KEYS // 2, replace=False)
        pq.write_table(pa.table({"key": keys, "value": rng.integers(0, 1000, len(keys))}),
                       _path("columnar_prior.parquet"))


def parse_command(line):
    row = json.loads(line)
    return TimestampedValue(UpsertCommand(row["key"], row["value"], row["offset"]), row["time"])


def parse_prior(line):
    row = json.loads(line)
    return row["key"], row["value"]


class NaiveUpsertFn(beam.DoFn):
    """The baseline: one ReadModifyWriteState read and write per element."""

    CURRENT = ReadModifyWriteStateSpec("current", coders.PickleCoder())

    def process(self, element, current=beam.DoFn.StateParam(CURRENT)):
        key, value = element
        old = current.read()
        if old != value:
            current.write(value)
            if old is not None:
                yield key, old, -1
            if value is not None:
                yield key, value, 1


def _options(streaming=False):
    return PipelineOptions(streaming=streaming)


class _Drain(beam.DoFn):
    """Consumes the output (a global Count would need windowing when streaming)."""

    def process(self, element):
        return ()


def _count(pcoll):
    return pcoll | beam.ParDo(_Drain())


def case_naive():
    with beam.Pipeline(options=_options()) as p:
        _count(p | beam.io.ReadFromText(_path("commands.jsonl")) | beam.Map(parse_command)
               | beam.Map(lambda c: (c.key, c.value)) | beam.ParDo(NaiveUpsertFn()))
    return N_COMMANDS


def case_read_parse_gbk():
    # The same inputs as the row API's cases: the commands and the snapshot,
    # read, parsed and grouped by key together, as plain tuples (a NamedTuple
    # value would be pickled by the shuffle's coder, which no floor should pay).
    with beam.Pipeline(options=_options()) as p:
        prior = (p | "P" >> beam.io.ReadFromText(_path("prior.jsonl"))
                 | "PP" >> beam.Map(parse_prior))
        commands = (p | beam.io.ReadFromText(_path("commands.jsonl")) | beam.Map(parse_command)
                    | beam.Map(lambda c: (c.key, (c.offset, c.value))))
        _count((commands, prior) | beam.Flatten() | beam.GroupByKey())
    return N_COMMANDS


def _row_api(flavor, **kwargs):
    with beam.Pipeline(options=_options()) as p:
        prior = p | "P" >> beam.io.ReadFromText(_path("prior.jsonl")) | "PP" >> beam.Map(parse_prior)
        _count(p | beam.io.ReadFromText(_path("commands.jsonl")) | beam.Map(parse_command)
               | Upsert(flavor, prior=prior, **kwargs))
    return N_COMMANDS


def case_grouped():
    return _row_api("grouped")


def _prepared(p):
    """The grouped flavor's input stages, as ``Upsert`` builds them: read, parse,
    prepare (validate and key) commands and snapshot, and group."""
    prior = (p | "P" >> beam.io.ReadFromText(_path("prior.jsonl")) | "PP" >> beam.Map(parse_prior)
             | "PrepPrior" >> beam.ParDo(PreparePrior()).with_outputs(INVALID_TAG, main="m"))
    commands = (p | beam.io.ReadFromText(_path("commands.jsonl")) | beam.Map(parse_command)
                | "Prep" >> beam.ParDo(PrepareCommands(None)).with_outputs(INVALID_TAG,
                                                                           main="m"))
    return (commands.m, prior.m) | beam.Flatten() | beam.GroupByKey()


class _ApplyWithoutOutput(GroupedUpsertFn):
    """The grouped flavor's apply step with its changes dropped, not emitted."""

    def process(self, element):
        for _ in super().process(element):
            pass
        return ()


def case_prepare_gbk():
    with beam.Pipeline(options=_options()) as p:
        _count(_prepared(p))
    return N_COMMANDS


def case_apply_without_output():
    with beam.Pipeline(options=_options()) as p:
        _count(_prepared(p) | beam.ParDo(_ApplyWithoutOutput()))
    return N_COMMANDS


def case_stateful():
    return _row_api("stateful")


def case_stateful_no_tombstones():
    return _row_api("stateful", tombstone_retention=0)


def case_stateful_streaming_no_tombstones():
    return case_stateful_streaming(tombstone_retention=0)


class _AtLastTime(beam.DoFn):
    """(entries, bytes) a shard keeps after the firing at the last command time."""

    def process(self, counts, ts=beam.DoFn.TimestampParam):
        if ts.micros == (N_TIMES - 1) * 1_000_000:
            yield 1, counts[6], counts[8]


def _state_after_the_last_time(retention_micros):
    """Total (shards, entries, bytes) kept after every command time is applied."""
    out = _path(f"state_bytes_{retention_micros}")
    with beam.Pipeline(options=_options()) as p:
        commands = (p | beam.io.ReadFromText(_path("commands.jsonl"))
                    | beam.Map(parse_command)
                    | beam.ParDo(PrepareCommands(None)).with_outputs(INVALID_TAG, main="ok"))
        prior = (p | "P" >> beam.io.ReadFromText(_path("prior.jsonl"))
                 | "PP" >> beam.Map(parse_prior)
                 | beam.ParDo(PreparePrior()).with_outputs(INVALID_TAG, main="ok"))
        counts = ((commands.ok, prior.ok) | beam.Flatten()
                  | beam.ParDo(ShardKeys())
                  | beam.ParDo(StatefulUpsertFn(retention_micros)).with_outputs(
                      INVALID_TAG, COUNTS_TAG, main="changes"))[COUNTS_TAG]
        _ = (counts | beam.ParDo(_AtLastTime())
             | beam.CombineGlobally(lambda kept: tuple(map(sum, zip((0, 0, 0), *kept))))
             | beam.Map(json.dumps)
             | beam.io.WriteToText(out, shard_name_template=""))
    with open(out) as f:
        return json.loads(f.read())


def case_state_bytes():
    """State per key and per shard after the last time, with and without tombstones."""
    got = {}
    for name, retention in (("no_tombstones", 0), ("tombstones", DEFAULT_TOMBSTONE_RETENTION_US)):
        shards, entries, size = _state_after_the_last_time(retention)
        got[name] = {"firing_shards": shards, "entries": entries, "bytes": size,
                     "bytes_per_entry": size / max(entries, 1),
                     "bytes_per_shard": size / DEFAULT_STATE_SHARDS}
    print("STATE " + json.dumps(got))
    return N_COMMANDS


def case_stateful_streaming(tombstone_retention=DEFAULT_TOMBSTONE_RETENTION_US / 1e6):
    # The streaming DirectRunner with TestStream: events are built in memory
    # (TestStream has no file source), ten watermark steps, one per time.
    from apache_beam.testing.test_stream import TestStream
    n = 50_000
    rows = []
    with open(_path("commands.jsonl")) as f:
        for _, line in zip(range(n), f):
            rows.append(parse_command(line))
    stream = TestStream()
    for t in range(N_TIMES):
        stream = stream.add_elements([r for r in rows if r.timestamp.micros == t * 1_000_000])
        stream = stream.advance_watermark_to(t + 1)
    stream = stream.advance_watermark_to_infinity()
    with beam.Pipeline(options=_options(streaming=True)) as p:
        _count(p | stream | Upsert("stateful", tombstone_retention=tombstone_retention))
    return n


def _batches():
    return pq.ParquetFile(_path("columnar.parquet")).iter_batches(COLUMNAR_BATCH_ROWS)


def case_columnar_kernel():
    table = pa.Table.from_batches(list(_batches()))
    prior = pq.read_table(_path("columnar_prior.parquet"))
    t0 = time.perf_counter()
    out = upsert_table(table, prior)
    print("OUTPUT", out.num_rows)
    return COLUMNAR_COMMANDS, time.perf_counter() - t0


def case_columnar():
    with beam.Pipeline(options=_options()) as p:
        batches = p | "Read" >> beam.io.ReadFromParquetBatched(_path("columnar.parquet"))
        prior = p | "Prior" >> beam.io.ReadFromParquetBatched(_path("columnar_prior.parquet"))
        _count(batches | UpsertBatches(prior=prior))
    return COLUMNAR_COMMANDS


CASES = {
    "naive": case_naive,
    "read_parse_gbk": case_read_parse_gbk,
    "grouped": case_grouped,
    "prepare_gbk": case_prepare_gbk,
    "apply_without_output": case_apply_without_output,
    "stateful": case_stateful,
    "stateful_streaming": case_stateful_streaming,
    "stateful_no_tombstones": case_stateful_no_tombstones,
    "stateful_streaming_no_tombstones": case_stateful_streaming_no_tombstones,
    "state_bytes": case_state_bytes,
    "columnar_kernel": case_columnar_kernel,
    "columnar": case_columnar,
}


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_case(name):
    t0, c0 = time.perf_counter(), _cpu_seconds()
    got = CASES[name]()
    elapsed = time.perf_counter() - t0
    cpu = _cpu_seconds() - c0
    if isinstance(got, tuple):
        got, elapsed = got
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sys.stdout.flush()
    print("RESULT " + json.dumps({"case": name, "commands": got, "seconds": elapsed,
                                  "per_second": got / elapsed, "cpu_seconds": cpu,
                                  "peak_rss_mb": peak_mb}))


TOMBSTONE_CASES = ("stateful_no_tombstones", "stateful_streaming_no_tombstones", "state_bytes")


def _run_subprocess(name):
    done = subprocess.run([sys.executable, "-m", "benchmarks.upsert_bench", "--case", name],
                          capture_output=True, text=True)
    lines = done.stdout.splitlines()
    line = [x for x in lines if x.startswith("RESULT ")]
    if done.returncode or not line:
        print(f"{name}: FAILED\n{done.stderr[-2000:]}")
        return None
    result = json.loads(line[0][7:])
    state = [x for x in lines if x.startswith("STATE ")]
    if state:
        result["state"] = json.loads(state[0][6:])
    return result


def _tombstones(rounds):
    """Throughput without and with tombstones, interleaved in one run, and state bytes."""
    rates = {}
    pairs = (("stateful_no_tombstones", "stateful"),
             ("stateful_streaming_no_tombstones", "stateful_streaming"))
    for i in range(rounds):
        for pair in pairs:
            for name in (pair if i % 2 == 0 else pair[::-1]):
                r = _run_subprocess(name)
                if r is not None:
                    rates.setdefault(name, []).append(r["per_second"])
                    print(f"round {i + 1} {name:34s} {r['per_second']:>9,.0f} commands/s  "
                          f"peak {r['peak_rss_mb']:,.0f} MB", flush=True)
    for old, new in pairs:
        if old in rates and new in rates:
            a, b = float(np.median(rates[old])), float(np.median(rates[new]))
            print(f"{new}: median {b:,.0f} /s with tombstones vs {a:,.0f} /s without: "
                  f"{b / a:.3f}x")
    state = _run_subprocess("state_bytes")
    if state is not None:
        for name, s in state["state"].items():
            print(f"state after the last time, {name}: {s['entries']:,d} entries, "
                  f"{s['bytes']:,d} bytes, {s['bytes_per_entry']:.1f} bytes per entry, "
                  f"{s['bytes_per_shard']:,.0f} bytes per shard")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, apache-beam {beam.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")


FLOOR_CASES = ("read_parse_gbk", "grouped", "stateful")
# The grouped flavor cut after its stages, for where its time beyond the floor goes.
SPLIT_CASES = ("prepare_gbk", "apply_without_output")


def _against_the_floor(rounds):
    """The row API's flavors against the read + parse + GroupByKey floor of the
    same inputs, interleaved (the order turns each round), best of the rounds;
    and the CPU time of the grouped flavor cut after each of its stages."""
    rates, cpu = {}, {}
    names = FLOOR_CASES + SPLIT_CASES
    for i in range(rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            r = _run_subprocess(name)
            if r is not None:
                rates.setdefault(name, []).append(r["per_second"])
                cpu.setdefault(name, []).append(r["cpu_seconds"])
                print(f"round {i + 1} {name:20s} {r['per_second']:>9,.0f} commands/s  "
                      f"cpu {r['cpu_seconds']:5.2f} s  peak {r['peak_rss_mb']:,.0f} MB",
                      flush=True)
    best = {name: max(v) for name, v in rates.items()}
    for name in ("grouped", "stateful"):
        if name in best and "read_parse_gbk" in best:
            print(f"{name}: best {best[name]:,.0f} /s against the floor's best "
                  f"{best['read_parse_gbk']:,.0f} /s: {best[name] / best['read_parse_gbk']:.2f}x")
    least = {name: min(v) for name, v in cpu.items()}
    steps = ("read_parse_gbk", "prepare_gbk", "apply_without_output", "grouped")
    if all(name in least for name in steps):
        print("grouped flavor, least CPU seconds of the rounds: floor "
              f"{least['read_parse_gbk']:.2f}; + prepare (validate, key) "
              f"{least['prepare_gbk'] - least['read_parse_gbk']:+.2f}; + apply "
              f"{least['apply_without_output'] - least['prepare_gbk']:+.2f}; + emitting the "
              f"changes {least['grouped'] - least['apply_without_output']:+.2f}; "
              f"= {least['grouped']:.2f}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, apache-beam {beam.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES))
    parser.add_argument("--tombstones", action="store_true",
                        help="the stateful flavor with tombstone_retention=0 and the default, "
                             "interleaved, plus the state bytes per key and shard")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the interleaved --tombstones or --floor cases (default 3)")
    parser.add_argument("--floor", action="store_true",
                        help="the grouped and stateful flavors against the read + parse + "
                             "GroupByKey floor, interleaved, best of --rounds")
    args = parser.parse_args(argv)
    make_data()
    if args.case:
        run_case(args.case)
        return
    if args.tombstones:
        _tombstones(args.rounds)
        return
    if args.floor:
        _against_the_floor(args.rounds)
        return
    results = {}
    for name in CASES:
        if name in TOMBSTONE_CASES or name in SPLIT_CASES:
            continue
        r = results[name] = _run_subprocess(name)
        if r is None:
            continue
        print(f"{name:20s} {r['commands']:>9,d} commands  {r['seconds']:7.1f} s  "
              f"{r['per_second']:>11,.0f} /s  peak {r['peak_rss_mb']:,.0f} MB", flush=True)
    rate = {k: v["per_second"] for k, v in results.items()}
    if "naive" in rate:
        for k in ("grouped", "stateful", "stateful_streaming"):
            if k in rate:
                print(f"{k} / naive baseline: {rate[k] / rate['naive']:.1f}x")
    if "columnar" in rate and "columnar_kernel" in rate:
        print(f"columnar / plain kernel: {rate['columnar'] / rate['columnar_kernel']:.2f}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, apache-beam {beam.__version__}, "
          f"{time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()

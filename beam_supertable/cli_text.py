"""What the command line prints: the progress bar and the reports as text.

Plain functions of the API's results (``inspect_table``'s report, an optimize
plan); they import nothing of the package, so the text can change without
touching the calls.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

__all__ = ["Progress", "format_inspection"]

PROGRESS_INTERVAL_S = 0.1      # at most ten progress redraws a second
PROGRESS_BAR_WIDTH = 30
DURATION_UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}


# -- progress ------------------------------------------------------------------
class Progress:
    """A one-line progress bar on ``stream``, drawn only when it is a terminal.

    Called as ``progress(done, total)`` (``Supertable.optimize``'s callback);
    redraws at most every ``PROGRESS_INTERVAL_S`` and always at the end.
    """

    def __init__(self, stream: TextIO, label: str, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._label = label
        self._clock = clock
        self._live = bool(getattr(stream, "isatty", lambda: False)())
        self._drawn = False
        self._last = float("-inf")

    def __call__(self, done: int, total: int) -> None:
        if not self._live:
            return
        now = self._clock()
        if done < total and now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        share = done / total if total else 1.0
        filled = int(round(share * PROGRESS_BAR_WIDTH))
        bar = "#" * filled + "." * (PROGRESS_BAR_WIDTH - filled)
        self._stream.write(f"\r{self._label} [{bar}] {done}/{total} ({share:.0%})")
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Ends the bar's line, if one was drawn."""
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False



# -- text output ---------------------------------------------------------------
def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def number(x: Any) -> str:
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.1f}"
    return f"{int(x):,}"


def duration_text(seconds: float) -> str:
    if seconds == 0:
        return "0s"
    out, rest = [], seconds
    for unit, width in DURATION_UNITS.items():
        if unit == "w":
            continue
        whole = int(rest // width)
        if whole:
            out.append(f"{whole}{unit}")
            rest -= whole * width
    if rest:
        out.append(f"{rest:g}s" if not out else f"{rest:.3g}s")
    return "".join(out)


def ranges(versions: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1-3, 7``."""
    spans: List[List[int]] = []
    for v in versions:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def count(value: Any) -> int:
    """A plan field that is either a count or the list of what it counts."""
    return len(value) if isinstance(value, (list, tuple, dict, set)) else int(value)


def plan_text(uri: str, version: int, plan: Dict[str, Any]) -> str:
    return (f"{uri} (version {version}): optimize would rewrite "
            f"{plural(count(plan['superfiles_to_rewrite']), 'superfile')} "
            f"({number(plan['rows_to_rewrite'])} rows, {size(plan['bytes_to_rewrite'])}) in "
            f"{plural(count(plan['groups']), 'group')}, reclaim "
            f"{number(plan['deleted_rows_to_reclaim'])} deleted rows, split "
            f"{plural(count(plan['cells_to_split']), 'cell')}; about "
            f"{plural(count(plan['estimated_superfiles_after']), 'superfile')} after")


def spread_text(spread: Optional[Dict[str, Any]], fmt: Callable[[Any], str]) -> str:
    if spread is None:
        return "n/a"
    return f"min {fmt(spread['min'])} / median {fmt(spread['median'])} / max {fmt(spread['max'])}"


def frontier_text(frontier: Optional[int]) -> str:
    if frontier is None:
        return "none"
    when = datetime.datetime.fromtimestamp(frontier / 1e6, datetime.timezone.utc)
    return f"{frontier} ({when.isoformat(timespec='seconds')})"


def format_inspection(report: Dict[str, Any]) -> str:
    """``inspect_table``'s report as a few lines for a terminal."""
    v, rows, sf = report["versions"], report["rows"], report["superfiles"]
    cells, storage, vac = report["cells"], report["storage"], report["vacuum"]
    stored = rows["stored"]
    share = f" ({rows['deleted'] / stored:.1%})" if stored else ""
    lines = [
        report["uri"],
        f"  versions    latest {v['latest']}, {plural(v['retained'], 'retained version')} "
        f"(oldest {v['oldest_retained']}), frontier {frontier_text(v['frontier'])}, last "
        f"commit {v['latest_commit']['operation']} at {v['latest_commit']['timestamp']}",
        f"  rows        {rows['live']:,} live, {rows['deleted']:,} deleted{share}, "
        f"{stored:,} stored",
        f"  superfiles  {sf['count']:,} holding {size(sf['bytes']['total'])}; size "
        f"{spread_text(sf['bytes'], size)} (target {size(sf['target_bytes'])}); "
        f"{sf['with_deletes']:,} with deletion vectors",
    ]
    grids = report["grids"]
    if cells["count"]:
        per_cell = spread_text(cells["rows_per_cell"], number) if cells["rows_per_cell"] \
            else f"unknown ({cells['superfiles_without_cell_rows']} superfiles predate " \
                 "per-cell counts)"
        lines.append(f"  cells       {cells['count']:,} on {plural(len(grids), 'grid')}; "
                     f"rows per cell {per_cell}")
    else:
        lines.append("  cells       none (no vector column, or no rows yet)")
    for g in grids:
        n_cells = "" if g["n_cells"] is None else f", {g['n_cells']:,} cells"
        lines.append(f"  grid        {g['id'][:12]} ({'current' if g['current'] else 'older'}"
                     f"{n_cells}): {plural(g['superfiles'], 'superfile')}, "
                     f"{g['rows']:,} rows in {g['cells']:,} cells")
    areas = ", ".join(f"{name} {size(a['bytes'])}" for name, a in storage["by_area"].items())
    ref = storage["referenced_by_latest"]
    lines.append(f"  storage     {size(storage['bytes'])} in "
                 f"{plural(storage['objects'], 'object')} ({areas}); the latest version "
                 f"references {size(ref['bytes'])} in {plural(ref['objects'], 'object')}")
    if ref["missing"]:
        lines.append(f"  MISSING     {plural(len(ref['missing']), 'referenced object')} not "
                     f"found, e.g. {ref['missing'][0]}")
    kinds = storage.get("by_kind", {})
    lines.append("  objects     " + ", ".join(
        f"{kind.replace('_', ' ')} {k['objects']:,} ({size(k['bytes'])})"
        for kind, k in kinds.items() if k["objects"]))
    tok = report.get("tokens")
    if tok:
        lines.append(f"  tokens      remembered {duration_text(tok['retention_s'])} (horizon "
                     f"{tok['horizon']} at the latest commit); "
                     f"{plural(tok['markers'], 'marker')}, "
                     f"{plural(tok['index_objects'], 'index object')}")
    schema = report.get("schema")
    if schema:
        columns = ", ".join(f"{c['name']} {c['type']} (id {c['id']})" for c in schema["columns"]
                            if c["name"] != "_id")
        lines.append(f"  schema      {columns}; last column id {schema['last_column_id']}")
        for change in schema["history"]:
            lines.append(f"  changed     version {change['version']}: {change['change']}")
    con = report.get("consumers")
    if con and con["list"]:
        named = ", ".join(f"{c['name']} at {c['version']} ({duration_text(round(c['age_s']))} "
                          f"ago{', expired' if c['expired'] else ''})" for c in con["list"])
        lines.append(f"  consumers   {named}; they hold "
                     f"{plural(con['held']['versions'], 'version')} "
                     f"({size(con['held']['bytes'])}) from vacuum; expiry "
                     f"{duration_text(con['expiry_s'])}")
    tags = report.get("tags")
    if tags and tags["list"]:
        named = ", ".join(f"{t['name']} at {t['version']}" for t in tags["list"])
        lines.append(f"  tags        {named}; they hold "
                     f"{plural(tags['held']['versions'], 'version')} "
                     f"({size(tags['held']['bytes'])}) from vacuum")
    rec, wait = vac["reclaimable"], vac["in_grace"]
    lines.append(f"  vacuum      would reclaim {size(rec['bytes'])} "
                 f"({plural(rec['objects'], 'object')}, {plural(rec['versions'], 'version')}) "
                 f"keeping {vac['retain_versions']} versions and a "
                 f"{duration_text(vac['grace_s'])} grace; {size(wait['bytes'])} in "
                 f"{plural(wait['objects'], 'unreferenced object')} still in grace")
    return "\n".join(lines)

"""Old module paths: the same module, imported with a warning that names the new path."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from beam_supertable._moved import MOVED


def _fresh(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_old_path_is_the_new_module_with_a_deprecation_warning():
    out = _fresh(f"""
        import importlib, json, sys, warnings
        found = {{}}
        for old, new in {MOVED!r}.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            found[old] = [module is sys.modules[new], module.__name__, module.__spec__.name,
                          [str(w.message) for w in caught
                           if issubclass(w.category, DeprecationWarning)]]
        print(json.dumps(found))
    """)
    assert set(out) == set(MOVED)
    for old, (same, name, spec_name, warned) in out.items():
        assert same and name == spec_name == MOVED[old], old
        assert len(warned) == 1 and MOVED[old] in warned[0] and old in warned[0], (old, warned)


def test_an_old_path_warns_where_the_user_imported_it(tmp_path):
    script = tmp_path / "user.py"
    script.write_text("from beam_supertable.manifest import Manifest, CommitRequest\n")
    done = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{script}:1: DeprecationWarning: beam_supertable.manifest moved to " \
           "beam_supertable.format.manifest" in done.stderr


def test_the_new_paths_and_the_public_api_import_without_a_warning():
    out = _fresh("""
        import json, warnings
        warnings.simplefilter("error", DeprecationWarning)
        import beam_supertable
        from beam_supertable import Supertable, WriteToSupertable, inspect_table
        from beam_supertable.transforms import ReadFromSupertable, UpsertToSupertable
        from beam_supertable.format.manifest import CommitRequest, Manifest
        from beam_supertable.format.store import ObjectStore
        from beam_supertable.testing import temporary_table
        from beam_supertable.fts.analysis import analyzer_of
        print(json.dumps([name for name in beam_supertable.__all__
                          if getattr(beam_supertable, name, None) is None]))
    """)
    assert out == []


@pytest.mark.parametrize("code, moved_to", [
    ("from beam_supertable.table import Supertable", "beam_supertable.table.supertable"),
    ("from beam_supertable.iceberg import table_location", "beam_supertable.iceberg.metadata"),
])
def test_a_module_that_became_a_package_still_gives_its_names(code, moved_to):
    out = _fresh(f"""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            {code}
        print(json.dumps([str(w.message) for w in caught
                          if issubclass(w.category, DeprecationWarning)]))
    """)
    assert len(out) == 1 and moved_to in out[0]


def test_an_unknown_name_of_a_package_is_still_an_attribute_error():
    import beam_supertable.iceberg
    import beam_supertable.table
    import beam_supertable.transforms
    for package in (beam_supertable.table, beam_supertable.iceberg, beam_supertable.transforms):
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name


def test_old_paths_are_attributes_of_the_package_and_old_names_still_import():
    out = _fresh("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import beam_supertable as b
            manifest = b.manifest.Manifest.__module__
            from beam_supertable.manifest import TOKEN_INDEX, grace_seconds
            from beam_supertable.write import METRICS, FLOOR_REFRESH_S
            from beam_supertable.table import *
            from beam_supertable.iceberg import *
            here = set(globals())
            names = sorted(n for n in ("Supertable", "CREATE_MODES", "METADATA") if n in here)
        print(json.dumps([manifest, names, len([w for w in caught
                          if issubclass(w.category, DeprecationWarning)])]))
    """)
    assert out[0] == "beam_supertable.format.manifest"
    assert out[1] == ["CREATE_MODES", "METADATA", "Supertable"]
    assert out[2] >= 8   # each old path and each old name warned


def test_old_paths_imported_from_many_threads_keep_their_own_specs():
    out = _fresh(f"""
        import importlib, json, sys, threading
        import beam_supertable   # loaded: the threads race on the old paths alone
        old = {sorted(MOVED)!r}
        barrier = threading.Barrier(len(old))
        def go(name):
            barrier.wait()
            importlib.import_module(name)
        threads = [threading.Thread(target=go, args=(n,)) for n in old]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(json.dumps([sys.modules[n].__spec__.name == sys.modules[n].__name__
                          for n in old]))
    """)
    assert all(out)

# Sourced by the entry scripts: creates or reuses a virtualenv and installs
# the project into it, again only when pyproject.toml or its constraints
# changed. Two environments:
#   default (.venv)       the newest apache-beam: users' Beam, the main job, every
#                         DirectRunner suite, the docs build; versions in
#                         constraints.txt; extras [test,docs,interop,gcs,azure]
#   VENV_KIND=flink       (.venv-flink) the apache-beam release whose Flink job
#                         server this machine can assemble (<beam.version> in
#                         flink/pom.xml); versions in flink/constraints.txt;
#                         extras [test]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ "${VENV_KIND:-default}" = flink ]; then
  VENV="${BEAM_PLUGIN_FLINK_VENV:-$ROOT/.venv-flink}"
  CONSTRAINTS="$ROOT/flink/constraints.txt"
  BEAM_PIN="apache-beam==$(sed -n 's:.*<beam.version>\(.*\)</beam.version>.*:\1:p' "$ROOT/flink/pom.xml")"
  EXTRAS="test"
else
  VENV="${BEAM_PLUGIN_VENV:-$ROOT/.venv}"
  CONSTRAINTS="$ROOT/constraints.txt"
  BEAM_PIN=""
  EXTRAS="test,docs,interop,gcs,azure"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.installed-$(printf '%s' "$BEAM_PIN" | cat - "$ROOT/pyproject.toml" "$CONSTRAINTS" | sha1sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "Installing the project into $VENV (once) ..." >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" -e "$ROOT[$EXTRAS]" $BEAM_PIN
  rm -f "$VENV"/.installed-*
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

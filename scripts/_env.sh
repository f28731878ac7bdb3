# Shared by scripts/serve and scripts/test: a project virtual environment
# with loopstop installed, made on first use. Sourced, not run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LOOPSTOP_VENV:-$ROOT/.venv}"

find_python() {
  for py in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$py" ] || continue
    if command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "loopstop needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

ensure_venv() {  # ensure_venv EXTRAS   e.g. ensure_venv "" or ensure_venv "[test]"
  local extras="$1" stamp
  if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV" >&2
    "$(find_python)" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
  fi
  stamp="$VENV/.loopstop-installed$extras"
  if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    echo "installing loopstop$extras into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT$extras"
    touch "$stamp"
  fi
}

# Shared by the data-tool tests (sourced): find_py MODULE... prints the first python3 that imports every
# module -- the project venv tools/setup.sh makes ($DFLASH_VENV, default ~/.local/share/dflash-train/venv),
# then Debian's /usr/bin/python3, then python3 on PATH -- or exits 77 (skipped) saying what is missing.
# HOME may be unset (CI's environment): the user's home from the password database then, as Python's expanduser.
DATA_TOOLS_VENV=${DFLASH_VENV:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.local/share/dflash-train/venv}
find_py() {
  local venv=$DATA_TOOLS_VENV
  local py
  for py in "$venv/bin/python3" /usr/bin/python3 python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c "import $(IFS=,; echo "$*")" >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  echo "SKIPPED: no python3 here imports $* (${SKIP_HINT:-tools/setup.sh installs them into $venv})" >&2
  exit 77
}

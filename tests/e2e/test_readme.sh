#!/usr/bin/env bash
# The README's promises a first week meets (issue 48 item 13): a LICENSE (Apache-2.0, the dflash-train
# authors); the first screen says what you get (OUT/drafter/, loadable by the official code, vLLM, SGLang)
# before the default job's trials; the metrics snippet runs as the README says (tools/dflash-python) on a real
# run's metrics.h5, with a python3 first on PATH that lacks h5py.
source "$(dirname "$0")/lib.sh"
R="$DFLASH_SRC/README.md"
head -1 "$DFLASH_SRC/LICENSE" | grep -q "^Copyright 20[0-9][0-9] the dflash-train authors$" || fail "LICENSE: no copyright line"
grep -q "Apache License" "$DFLASH_SRC/LICENSE" && grep -q "Version 2.0, January 2004" "$DFLASH_SRC/LICENSE" || fail "LICENSE is not Apache-2.0"
what=$(grep -n "^\*\*What you get\*\*: a trained drafter in \`OUT/drafter/\`" "$R" | cut -d: -f1)
trials=$(grep -n "Trials of this" "$R" | head -1 | cut -d: -f1)
[ -n "$what" ] && [ -n "$trials" ] && [ "$what" -lt "$trials" ] && [ "$what" -le 24 ] ||
  fail "README: 'What you get' (line ${what:-none}) is not on the first screen before the trials (line ${trials:-none})"
for w in "official z-lab DFlash code" vLLM SGLang; do
  sed -n "${what},$((what + 6))p" "$R" | grep -q "$w" || fail "README's 'What you get' does not name $w"
done

run_job snip 2 120 --topology 1-1 --max-steps 4 --log-every 2
expect_rc 0 snip
# The README's metrics snippet, on this run's file, through tools/dflash-python with a bare python3 first on PATH.
sed -n '/^  ```python$/,/^  ```$/p' "$R" | sed '1d;$d;s/^  //' | sed "s|runs/default/metrics.h5|$WORK/snip/metrics.h5|" >"$WORK/snippet.py"
grep -q "h5py.File" "$WORK/snippet.py" || fail "README: no metrics snippet found"
mkdir -p "$WORK/bin"
printf '#!/bin/sh\necho "a python3 without h5py" >&2; exit 1\n' >"$WORK/bin/python3"
chmod +x "$WORK/bin/python3"
PATH="$WORK/bin:$PATH" "$DFLASH_SRC/tools/dflash-python" "$WORK/snippet.py" >"$WORK/snippet.log" 2>&1 ||
  { cat "$WORK/snippet.log" >&2; fail "the README's snippet does not run under tools/dflash-python"; }
grep -q "^1-1 4 " "$WORK/snippet.log" || { cat "$WORK/snippet.log" >&2; fail "the snippet printed no topology/step line"; }
grep -q "tools/dflash-python" "$R" || fail "README does not name tools/dflash-python"
echo "PASS"

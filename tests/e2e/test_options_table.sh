#!/usr/bin/env bash
# docs/pipeline.md's options table is the one `dflash-train --help-markdown` prints from the option rows
# (src/runtime/option_table.cpp): every option documented, each with the default the command line gives.
# tools/options-table rewrites the docs' table from the binary.
source "$(dirname "$0")/lib.sh"
"$DFLASH_SRC/tools/options-table" --print-docs "$DFLASH_SRC/docs/pipeline.md" >"$WORK/docs.md" \
  || fail "docs/pipeline.md has no options table between the markers tools/options-table looks for"
"$TRAIN" --help-markdown >"$WORK/binary.md"
[ "$(grep -c '^| `--' "$WORK/binary.md")" -ge 80 ] || fail "--help-markdown printed too few options"
diff -u "$WORK/docs.md" "$WORK/binary.md" >"$WORK/diff" || {
  cat "$WORK/diff" >&2
  fail "docs/pipeline.md's options table is not what dflash-train --help-markdown prints (-: the docs, +: the binary); run tools/options-table $DFLASH_BIN/dflash-train"
}
echo "PASS"

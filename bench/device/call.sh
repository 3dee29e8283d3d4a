#!/usr/bin/env bash
# On the GPU machine (bench/device/prepare.sh made what it needs): unpack the carried programs once per
# tarball (a warm machine keeps them between calls), then bash bench/pending_gpu_runs.sh BIN $OUT PART...
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${DFLASH_DEVICE_BIN:-/tmp/dflash-device-bin}  # outside the tree: a carried gpu-carry/ replaces its folder
sum=$(md5sum gpu-carry/bin.tar.xz | cut -d' ' -f1)
if [ "$(cat "$B/.sum" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$B" && mkdir -p "$B" && tar -xJf gpu-carry/bin.tar.xz -C "$B" && echo "$sum" > "$B/.sum"
  echo "# unpacked the programs of $(cat gpu-carry/bin.commit 2>/dev/null) ($sum)"
fi
exec bash bench/pending_gpu_runs.sh "$B" "${OUT:?the device tool sets OUT}" "$@"

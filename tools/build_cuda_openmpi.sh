#!/usr/bin/env bash
# Build (once, cached) a CUDA-aware Open MPI 4.1.4 from Debian's source package.
#
# The system /usr/bin/mpirun (Debian's Open MPI 4.1.4) is not CUDA-aware.  This
# builds the same upstream release with --with-cuda into a small, relocatable
# prefix that can travel to a GPU machine (e.g. Ubuntu 24.04 with Open MPI 4.1.6
# system packages): hwloc, libevent and PMIx are the copies bundled in the
# tarball, and no network stack that needs distro libraries (verbs, UCX, OFI,
# PSM) is built, so the prefix needs nothing beyond glibc, libz and libm.
#
# Usage:
#   tools/build_cuda_openmpi.sh [PREFIX [PACK]]   build if needed, print PREFIX
#   tools/build_cuda_openmpi.sh --check [PREFIX]  run the self-check only
#
#   PREFIX  default ${DFLASH_OMPI_PREFIX:-${DFLASH_CACHE:-$HOME/.cache/dflash}/openmpi-4.1.4-cuda}
#   PACK    (or DFLASH_OMPI_PACK) also write PREFIX as a tar archive; the
#           compressor follows the name: .tar.zst (zstd -19), .tar.xz, .tar.gz
#   CUDA_HOME (default /usr/local/cuda), DFLASH_OMPI_JOBS (default nproc)
#
# If PREFIX/.complete exists the build is skipped (that is the cache).
# Progress lines ("# ...") and the environment to use the prefix go to stderr;
# stdout gets only the prefix path, so  P=$(tools/build_cuda_openmpi.sh)  works.
# To use it (also after copying the prefix elsewhere: OPAL_PREFIX relocates it):
#   export OPAL_PREFIX=$P PATH=$P/bin:$PATH LD_LIBRARY_PATH=$P/lib:$LD_LIBRARY_PATH
# All three are needed where a system Open MPI exists: without LD_LIBRARY_PATH
# the tools of a moved prefix load the system libopen-pal.so.40 and report its
# paths, and FindMPI then silently falls back to the system MPI.
# CMake (fresh build dir, or add -U 'MPI*' to drop a cached system MPI):
#   -DMPI_HOME=$P   (also finds $P/bin/mpiexec), or
#   -DMPI_C_COMPILER=$P/bin/mpicc -DMPI_CXX_COMPILER=$P/bin/mpicxx
#   -DMPIEXEC_EXECUTABLE=$P/bin/mpiexec (else /usr/bin/mpiexec unless $P/bin is first in PATH)
set -euo pipefail

OMPI_VERSION=4.1.4
ORIG_TARBALL=openmpi_${OMPI_VERSION}.orig.tar.xz
# sha256 of Debian bookworm's openmpi_4.1.4.orig.tar.xz (source package 4.1.4-3)
ORIG_SHA256=${DFLASH_OMPI_ORIG_SHA256-ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263}
CACHE=${DFLASH_CACHE:-$HOME/.cache/dflash}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=${DFLASH_OMPI_JOBS:-$(nproc 2>/dev/null || echo 2)}

log() { echo "# $*" >&2; }
die() { echo "# ERROR: $*" >&2; exit 1; }

CHECK_ONLY=0
if [[ ${1:-} == --check ]]; then CHECK_ONLY=1; shift; fi
case ${1:-} in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0;; esac
PREFIX=${1:-${DFLASH_OMPI_PREFIX:-$CACHE/openmpi-${OMPI_VERSION}-cuda}}
PACK=${2:-${DFLASH_OMPI_PACK:-}}
[[ $PREFIX == /* ]] || PREFIX=$PWD/$PREFIX
PREFIX=${PREFIX%/}
[[ -z $PACK || $PACK == /* ]] || PACK=$PWD/$PACK

print_env() {
  log "CUDA-aware Open MPI ${OMPI_VERSION} prefix ($(du -sh "$PREFIX" | cut -f1)):"
  log "  export OPAL_PREFIX=$PREFIX PATH=$PREFIX/bin:\$PATH LD_LIBRARY_PATH=$PREFIX/lib:\$LD_LIBRARY_PATH"
  log "  cmake ... -DMPI_HOME=$PREFIX   (fresh build dir, or -U 'MPI*')"
  echo "$PREFIX"
}

# ---------------------------------------------------------------- self-check
self_check() {
  local p=$1 t rc=0
  [[ -x $p/bin/mpicc && -x $p/bin/mpirun ]] || die "no Open MPI under $p"
  t=$(mktemp -d)
  cat > "$t/cuda_aware.c" <<'EOF'
#include <stdio.h>
#include <mpi.h>
#include <mpi-ext.h>
#ifndef MPIX_CUDA_AWARE_SUPPORT
#define MPIX_CUDA_AWARE_SUPPORT -1 /* mpi-ext.h lacks the CUDA extension */
#endif
int main(int argc, char **argv) {
  int rank, size, rt = -1;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
#if MPIX_CUDA_AWARE_SUPPORT >= 0
  rt = MPIX_Query_cuda_support();
#endif
  printf("rank %d/%d: MPIX_CUDA_AWARE_SUPPORT=%d MPIX_Query_cuda_support()=%d\n",
         rank, size, (int)MPIX_CUDA_AWARE_SUPPORT, rt);
  MPI_Finalize();
  return 0;
}
EOF
  # Run in place, then from a copy at another path (as on the GPU machine).
  # Without an NVIDIA driver (no libcuda.so.1) MPI_Init prints a help message
  # saying CUDA-aware support is disabled; shown for the first run only.  (With
  # -np 2 Open MPI 4.1.4 then at times also logs "ORTE_ERROR_LOG: Data unpack
  # ... show_help.c", a race in forwarding that message; harmless.)
  local moved q n=0 bad=0
  moved=$t/moved/$(basename "$p")
  mkdir -p "$t/moved"; cp -a "$p" "$moved"
  for q in "$p" "$moved"; do
    n=$((n + 1))
    log "self-check $n: $q/bin/mpicc, then mpirun -np 2"
    (
      export OPAL_PREFIX=$q PATH=$q/bin:$PATH LD_LIBRARY_PATH=$q/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
      [[ $n == 1 ]] || export OMPI_MCA_opal_warn_on_missing_libcuda=0
      "$q/bin/mpicc" -O2 -o "$t/cuda_aware" "$t/cuda_aware.c"
      [[ $("$q/bin/mpicc" -showme:incdirs) == "$q/include" ]] \
        || { echo "BAD: mpicc -showme:incdirs is '$("$q/bin/mpicc" -showme:incdirs)', not $q/include"; exit 1; }
      "$q/bin/mpirun" -np 2 "$t/cuda_aware" || echo "BAD: mpirun exit $?"
      [[ $n != 1 ]] || "$q/bin/ompi_info" --parsable --all 2>/dev/null \
        | grep -m1 '^mca:mpi:base:param:mpi_built_with_cuda_support:value' > "$t/info" || true
    ) > "$t/out.$n" 2>&1 || rc=1
    sed 's/^/#   /' "$t/out.$n" >&2
    grep -q '^BAD:' "$t/out.$n" && bad=1
  done
  [[ -s $t/info ]] && log "  ompi_info: $(cat "$t/info")"
  log "  mpi-ext.h: $(grep -h -r 'define MPIX_CUDA_AWARE_SUPPORT' "$p/include" | head -1)"
  local needed
  needed=$(find "$p/bin" "$p/lib" -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c \
             'for f; do readelf -d "$f" 2>/dev/null; done' sh {} + \
           | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u \
           | grep -v -E '^lib(mpi|open-pal|open-rte|mca_common_[a-z_]*|ompitrace)\.so' | tr '\n' ' ')
  log "  external libraries needed: $needed"
  if ! { ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; }; then
    log "  note: no libcuda.so.1 (NVIDIA driver) on this machine: MPI_Init warns that CUDA-aware"
    log "  support is disabled at run time; MPIX_Query_cuda_support() in 4.1.x reports the build"
  fi
  local n_ok
  n_ok=$(cat "$t"/out.* | grep -c 'MPIX_CUDA_AWARE_SUPPORT=1 MPIX_Query_cuda_support()=1' || true)
  rm -rf "$t"
  if [[ $rc -ne 0 || $bad -ne 0 || $n_ok -ne 4 ]]; then
    log "self-check FAILED (want MPIX_CUDA_AWARE_SUPPORT=1 and MPIX_Query_cuda_support()=1 on both ranks, in place and moved)"
    return 1
  fi
  log "self-check OK: CUDA-aware at compile time and at run time"
}

if [[ $CHECK_ONLY == 1 ]]; then
  self_check "$PREFIX"
  exit
fi

# ---------------------------------------------------------------- pack
make_pack() {
  local out=$1 dir base comp
  dir=$(dirname "$PREFIX"); base=$(basename "$PREFIX")
  case $out in
    *.tar.zst|*.tzst) comp=(zstd -q -19 -T0) ;;
    *.tar.xz|*.txz)   comp=(xz -9 -T0) ;;
    *.tar.gz|*.tgz)   comp=(gzip -9) ;;
    *) die "PACK must end in .tar.zst, .tar.xz or .tar.gz: $out" ;;
  esac
  command -v "${comp[0]}" >/dev/null || need_pkgs "${comp[0]}"
  mkdir -p "$(dirname "$out")"
  log "packing $PREFIX -> $out (${comp[0]})"
  tar -C "$dir" --owner=0 --group=0 -cf - "$base" | "${comp[@]}" > "$out.tmp"
  mv "$out.tmp" "$out"
  log "  archive size: $(du -h "$out" | cut -f1) ($(stat -c %s "$out") bytes); unpack with" \
      "tar -C DIR -xf $(basename "$out") and set OPAL_PREFIX=DIR/$base"
}

need_pkgs() {  # apt-get install the given Debian packages
  [[ $# -gt 0 ]] || return 0
  if [[ $(id -u) -ne 0 ]]; then die "missing packages: $* (apt-get install them)"; fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2 \
    || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2; }
}

# ---------------------------------------------------------------- cache hit
if [[ -f $PREFIX/.complete ]]; then
  if [[ -n $PACK && ! -f $PACK ]]; then make_pack "$PACK"; fi
  print_env
  exit 0
fi

mkdir -p "$CACHE"
exec 9> "$CACHE/.openmpi-${OMPI_VERSION}-cuda.lock"
if command -v flock >/dev/null; then
  flock -n 9 || { log "another build holds $CACHE/.openmpi-${OMPI_VERSION}-cuda.lock; waiting"; flock 9; }
  if [[ -f $PREFIX/.complete ]]; then print_env; exit 0; fi
fi

[[ -f $CUDA_HOME/include/cuda.h ]] || die "no CUDA toolkit at CUDA_HOME=$CUDA_HOME"
CUDA_VER=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$CUDA_HOME/include/cuda.h")
log "building CUDA-aware Open MPI ${OMPI_VERSION} into $PREFIX (CUDA_VERSION $CUDA_VER, make -j$JOBS)"
T0=$(date +%s)

# ---------------------------------------------------------------- build deps
missing=()
for c in dpkg-source:dpkg-dev make:make gcc:gcc g++:g++ perl:perl xz:xz-utils flex:flex \
         strip:binutils readelf:binutils; do
  command -v "${c%%:*}" >/dev/null || missing+=("${c#*:}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  need_pkgs "${missing[@]}"
fi

# ---------------------------------------------------------------- source
SRC=$CACHE/src/openmpi-$OMPI_VERSION
mkdir -p "$SRC"
if [[ ! -f $SRC/$ORIG_TARBALL ]]; then
  log "apt-get source --download-only openmpi (into $SRC)"
  # Prefer the system's deb-src entries; without any, use a private sources
  # list and lists dir under the cache (the system apt config is not touched).
  if ! (cd "$SRC" && apt-get -q source --download-only openmpi >&2 2>/dev/null); then
    APT=$CACHE/apt
    . /etc/os-release
    codename=${VERSION_CODENAME:-bookworm}
    mkdir -p "$APT/lists/partial"
    cat > "$APT/sources.list" <<EOF
deb-src http://deb.debian.org/debian $codename main
deb-src http://deb.debian.org/debian $codename-updates main
deb-src http://deb.debian.org/debian-security $codename-security main
EOF
    aptopt=(-o "Dir::Etc::SourceList=$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$APT/lists" -o APT::Sandbox::User=root)
    log "no deb-src in the system apt config: using $APT/sources.list ($codename)"
    apt-get "${aptopt[@]}" -qq update >&2
    (cd "$SRC" && apt-get "${aptopt[@]}" -q source --download-only openmpi >&2)
  fi
  [[ -f $SRC/$ORIG_TARBALL ]] || die "apt-get source did not give $ORIG_TARBALL (Debian's openmpi is $(ls "$SRC"/*.dsc 2>/dev/null))"
fi
if [[ -n $ORIG_SHA256 ]]; then
  echo "$ORIG_SHA256  $SRC/$ORIG_TARBALL" | sha256sum -c --quiet - || die "checksum mismatch: $SRC/$ORIG_TARBALL"
fi

BUILD=$CACHE/build/openmpi-${OMPI_VERSION}-cuda
LOG=$CACHE/build/openmpi-${OMPI_VERSION}-cuda.log
log "unpacking $ORIG_TARBALL into $BUILD (Debian patches are not applied)"
rm -rf "$BUILD"; mkdir -p "$BUILD"
tar -C "$BUILD" --strip-components=1 -xf "$SRC/$ORIG_TARBALL"
[[ -x $BUILD/configure && -d $BUILD/opal/mca/btl/smcuda ]] || die "unexpected tarball layout in $BUILD"

# ---------------------------------------------------------------- prefix
if [[ -e $PREFIX ]]; then
  if [[ -f $PREFIX/.dflash-partial || -z $(ls -A "$PREFIX") ]]; then
    log "removing the incomplete earlier install in $PREFIX"; rm -rf "$PREFIX"
  else
    die "$PREFIX exists and is not ours (no .complete/.dflash-partial); remove it or pick another prefix"
  fi
fi
mkdir -p "$PREFIX"; : > "$PREFIX/.dflash-partial"

# ---------------------------------------------------------------- configure
# Bundled hwloc/libevent/pmix: no dependency on distro versions of them.
# No verbs/UCX/OFI/PSM/knem/xpmem/libltdl: nothing that needs distro libraries
# (single-node GPU runs use the smcuda/vader BTLs with CUDA IPC); the netlink
# "reachable" component would need libnl-3 (TCP then uses the weighted one).  No ROMIO
# (ompio still provides MPI-IO), no Fortran, no OpenSHMEM, no Java, no C++ bindings.
CONFIGURE=(./configure --prefix="$PREFIX" --with-cuda="$CUDA_HOME"
  --with-hwloc=internal --with-libevent=internal --with-pmix=internal
  --disable-mpi-fortran --disable-oshmem --disable-mpi-java --disable-mpi-cxx
  --disable-io-romio --without-verbs --without-ucx --without-ofi --without-psm
  --without-psm2 --without-knem --without-xpmem --without-libltdl
  --enable-mca-no-build=reachable-netlink
  --enable-shared --disable-static --disable-dependency-tracking)
log "configure: ${CONFIGURE[*]}"
log "  (full output: $LOG)"
: > "$LOG"
run_logged() {  # run in $BUILD, output to $LOG; on failure show its tail
  if ! (cd "$BUILD" && "$@") >> "$LOG" 2>&1; then
    tail -n 40 "$LOG" | sed 's/^/#   /' >&2
    die "'$*' failed (see $LOG)"
  fi
}
run_logged "${CONFIGURE[@]}"
grep -q '^#define OPAL_CUDA_SUPPORT 1' "$BUILD/opal/include/opal_config.h" \
  || die "configure did not enable CUDA support (see $LOG)"
log "configure done ($(( $(date +%s) - T0 ))s); make -j$JOBS"
run_logged make -j"$JOBS" V=0
log "make done ($(( $(date +%s) - T0 ))s); make install"
run_logged make install V=0

# ---------------------------------------------------------------- slim down
log "slimming $PREFIX (was $(du -sh "$PREFIX" | cut -f1))"
rm -rf "$PREFIX/share/man" "$PREFIX/share/doc" "$PREFIX/share/openmpi/doc"
rm -f "$PREFIX/share/openmpi/openmpi-valgrind.supp" "$PREFIX/share/openmpi"/mpif*-wrapper-data.txt \
      "$PREFIX/share/openmpi/ortecc-wrapper-data.txt" "$PREFIX/share/openmpi/openmpi-totalview.tcl"
find "$PREFIX/lib" \( -name '*.a' -o -name '*.la' \) -delete
# Tools not needed to run mpirun or to build programs (ompi_info, orted,
# orterun/mpirun/mpiexec, opal_wrapper and the mpicc/mpicxx links stay).
for b in ompi-clean orte-clean ompi-server orte-server orte-info ortecc opalcc opalc++ \
         ompi-dvm orte-dvm ompi-ps orte-ps ompi-top orte-top prun ompi-submit \
         mpif77 mpif90 mpifort oshcc oshfort oshrun shmemcc shmemfort shmemrun \
         pmix_info pattrs pevent plookup pps aggregate_profile.pl profile2mat.pl; do
  rm -f "$PREFIX/bin/$b"
done
find "$PREFIX/bin" "$PREFIX/lib" -type f | while read -r f; do
  if [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == 177ELF ]]; then
    strip --strip-unneeded "$f" 2>/dev/null || true
  fi
done
rm -f "$PREFIX/.dflash-partial"

# ---------------------------------------------------------------- check + mark
self_check "$PREFIX" || die "self-check failed; $PREFIX left incomplete"
{
  echo "Open MPI ${OMPI_VERSION} (Debian orig tarball), CUDA_VERSION $CUDA_VER, built $(date -u +%FT%TZ) on $(. /etc/os-release; echo "$PRETTY_NAME")"
  echo "configure: ${CONFIGURE[*]}"
} > "$PREFIX/.complete"
log "built in $(( $(date +%s) - T0 ))s; prefix size $(du -sh "$PREFIX" | cut -f1)"
if [[ -n $PACK ]]; then make_pack "$PACK"; fi
print_env

# shellcheck shell=bash
# shellcheck disable=SC2034  # next_topology* are read by the scripts that source this file
# OUT/next-topology: the split the next start of a launch script trains on, sourced by jobs/mpirun/train.sh
# and jobs/slurm/*.sbatch (docs/checkpoint.md "Changing the split").
#
# To move a run to another split without losing it: write the split into the run directory (the --out of the
# command) and send the stop signal; the job checkpoints and exits 75, and its next start (run the same
# train.sh command again; an sbatch script requeues itself) resumes the checkpoint on that split:
#
#   echo 6-2 > RUN/next-topology; kill -USR1 <train.sh pid>            (or: scancel --signal=USR1 --batch JOBID)
#
# The file holds one line: T-D (digits-digits: targets and drafters per node), colocated (every rank both
# roles, docs/pipeline.md "The colocated layout") or auto. It overrides the
# command's --topology (it is appended after the command's arguments: a repeated option resolves last-wins,
# src/runtime/options.cpp) and is kept, so every later start (each requeue) stays on that split; delete it to
# go back to the command's own. Anything else in it (two lines, 6_2, an empty file) ends the script with
# status=failed rc=2 before mpirun or srun starts. On several nodes the split is per node; the node count
# is the launcher's (NP, or Slurm's allocation), never the file's.
#
# Use:
#   next_topology_out "$@"               the run directory, in $next_topology_out: --out DIR / --out=DIR (the
#                                        last one), else the out line of --config FILE (`out = DIR`, YAML's
#                                        `out: DIR`, TOML's `out = "DIR"`); "" when neither
#   next_topology_read DIR               $next_topology: the file's split ("" without a file), $next_topology_file
#                                        its path; returns 2 on a malformed file, the reason in
#                                        $next_topology_error

next_topology_out() {
  local a prev="" cfg=""
  next_topology_out=""
  for a in "$@"; do
    case "$prev" in
      --out) next_topology_out=$a ;;
      --config) cfg=$a ;;
    esac
    case "$a" in
      --out=*) next_topology_out=${a#--out=} ;;
      --config=*) cfg=${a#--config=} ;;
    esac
    prev=$a
  done
  if [ -z "$next_topology_out" ] && [ -n "$cfg" ] && [ -r "$cfg" ]; then
    case "$cfg" in
      *.yaml | *.yml | *.YAML | *.YML)  # out: DIR (flat YAML, src/runtime/config_file.h), quotes dropped
        next_topology_out=$(sed -n 's/[[:space:]]#.*//; s/^out:[[:space:]]*//p' "$cfg" | head -n 1 |
          sed "s/[[:space:]]*\$//; s/^\"\(.*\)\"\$/\1/; s/^'\(.*\)'\$/\1/") ;;
      *.toml | *.TOML)  # out = "DIR"
        next_topology_out=$(sed -n 's/^[[:space:]]*out[[:space:]]*=[[:space:]]*//p' "$cfg" | head -n 1 |
          sed "s/[[:space:]]*#[^\"']*\$//; s/[[:space:]]*\$//; s/^\"\(.*\)\"\$/\1/; s/^'\(.*\)'\$/\1/") ;;
      *)  # key = value lines; '#' starts a comment (as dflash-train reads the file)
        next_topology_out=$(sed -n 's/#.*//; s/^[[:space:]]*out[[:space:]]*=[[:space:]]*//p' "$cfg" | head -n 1 |
          sed 's/[[:space:]]*$//') ;;
    esac
  fi
  return 0
}

next_topology_read() {
  local dir=$1 line value="" n=0 shown text
  next_topology="" next_topology_error=""
  next_topology_file=${dir:+$dir/next-topology}
  [ -n "$dir" ] || return 0
  [ -e "$next_topology_file" ] || [ -L "$next_topology_file" ] || return 0
  # --out may be shared: a link planted at the name would print a file of anyone's into the job's log, a FIFO
  # would block the read. Refused: a link, anything but a regular file with one link. The text is read
  # through one descriptor that must be the very file checked (device, inode; under a deadline, so a FIFO
  # swapped in after the check cannot block it), at most 4 KiB of it.
  if [ -L "$next_topology_file" ]; then
    next_topology_error="$next_topology_file is a symbolic link: refused (it is read from the run directory itself); delete it and write the split into the file"
    return 2
  fi
  if [ ! -f "$next_topology_file" ] || [ ! -r "$next_topology_file" ]; then
    next_topology_error="$next_topology_file is not a readable file: it should hold one line T-D (e.g. 6-2), colocated or auto; fix it, or delete it to use the --topology of the command"
    return 2
  fi
  if ! text=$(timeout -k 1 5 bash -c '
      exec 3<"$1" || exit 3
      [ "$(stat -L -c %F:%d:%i:%h /proc/self/fd/3)" = "$(stat -c %F:%d:%i:%h -- "$1")" ] || exit 4
      [ "$(stat -c %F:%h -- "$1")" = "regular file:1" ] || [ "$(stat -c %F:%h -- "$1")" = "regular empty file:1" ] || exit 4
      head -c 4096 <&3' _ "$next_topology_file"); then
    next_topology_error="$next_topology_file is not a plain file of its own (a link, hard link or FIFO, or it changed while read): refused; delete it and write the split into the file"
    return 2
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line//$'\r'/}
    line=${line#"${line%%[![:space:]]*}"}
    line=${line%"${line##*[![:space:]]}"}
    [ -n "$line" ] || continue
    n=$((n + 1))
    [ $n -eq 1 ] && value=$line
  done <<<"$text"
  if [ $n -eq 1 ] && { [[ $value =~ ^[0-9]+-[0-9]+$ ]] || [ "$value" = auto ] || [ "$value" = colocated ]; }; then
    next_topology=$value
    return 0
  fi
  if [ $n -eq 0 ]; then
    shown="nothing"
  else
    # Only [0-9A-Za-z_.-] and spaces are ever printed: anything else (a terminal escape, a quote) shows as '?'.
    shown=$(printf '%s' "${text:0:60}" | tr '\n' ' ' | LC_ALL=C tr -c '0-9A-Za-z_. -' '?' | sed 's/[[:space:]]*$//')
    shown="\"$shown\""
  fi
  next_topology_error="$next_topology_file holds $shown: it should hold one line T-D (e.g. 6-2), colocated or auto; fix it, or delete it to use the --topology of the command"
  return 2
}

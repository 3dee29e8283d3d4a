// OUT/next-topology, the run's remembered split (docs/checkpoint.md "The remembered split"): the launch
// scripts read it at every start (jobs/next-topology.sh), and the job itself at a resume, so a split chosen
// by --rebalance auto, or written there by the operator, survives a kill or a requeue. The rule, the same
// for both: at a resume, a T-D in the file wins over the command's --topology; delete the file to train on
// the command's. `colocated` is a layout like a split here (--rebalance auto may move a run to or from it).
#pragma once
#include <cstdint>
#include <string>

#include "dflash/options.h"
#include "dflash/topology.h"

namespace dflash {

// What OUT/next-topology holds: no file, a split, `auto`, or anything else (Malformed: `text` says what).
struct RememberedSplit {
  enum class Kind : uint8_t { None, Split, Auto, Malformed };
  Kind kind = Kind::None;
  TopologySpec split;  // Kind::Split
  std::string text;    // the file's line as shown ([0-9A-Za-z_. -] only, at most 60)
};

// Read only from a regular file of one link at the name, through --out's descriptor (O_NOFOLLOW |
// O_NONBLOCK: a link, hard link or FIFO planted in a shared --out neither redirects the read nor blocks it;
// each is Malformed, its text never shown), at most 256 bytes. The format is
// jobs/next-topology.sh's: one non-blank line, T-D, colocated or auto, blanks and a CR around it ignored.
RememberedSplit read_remembered_split(const std::string& out_dir);

// World rank 0, when --rebalance auto has just changed the split to `split`: OUT/next-topology := "T-D\n"
// (or "colocated\n")
// (written atomically), and says so.
void remember_split(const std::string& out_dir, const TopologySpec& split);

// Collective over MPI_COMM_WORLD, once at the job's start (not --topology auto): the split this start trains
// on. World rank 0 decides: at a resume (a checkpoint --resume finds), a split in OUT/next-topology that
// differs from --topology wins, and the line says which and why; a malformed file is the launch scripts'
// error (BadOptions, exit 2). A fresh start, or no file: --topology.
TopologySpec split_at_start(const Options& o);

}  // namespace dflash

// OUT/train.log opened the way every file at a fixed name under --out is (include/dflash/safe_file.h), then
// handed to the run log (include/dflash/run_log.h, src/base/run_log.cpp).
#include <fcntl.h>

#include <cerrno>

#include "dflash/error.h"
#include "dflash/run_log.h"
#include "dflash/safe_file.h"

namespace dflash {

void open_run_log(const std::string& path) {
  if (run_log_attached()) return;
  const int fd = open_own_file(path, O_WRONLY | O_CREAT | O_APPEND, new_file_mode());
  DF_CHECK_HINT(fd >= 0, SystemFailure, "cannot open the run's log " << path << ": " << own_file_error(errno),
                "check that --out is writable and that train.log there is a plain file");
  attach_run_log(fd);
}

}  // namespace dflash

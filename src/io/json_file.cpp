// See json_file.h.
#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "dflash/error.h"

namespace dflash {

namespace {
constexpr int64_t kMostJsonBytes = int64_t{64} << 20;

// The text of a file the user named: links followed, but a FIFO never blocks (O_NONBLOCK, then fstat).
int read_given_text(const std::string& path, std::string* text) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st;
  int err = ::fstat(fd, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? EINVAL : st.st_size > kMostJsonBytes ? EFBIG : 0;
  for (char buf[65536]; err == 0;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    text->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return err;
}
}  // namespace

JsonFile try_read_json_file(const std::string& path, JsonExpect expect, LinkPolicy links) {
  JsonFile f;
  // A regular file of bounded size only: a config.json linked to /dev/zero grew without bound, a FIFO
  // blocked forever. 64 MiB is far above any config or index file (the largest index is a few MiB).
  std::string text;
  const int err = links == LinkPolicy::Refuse
                      ? read_own_text(path, kMostJsonBytes, HardLinks::Accept, &text)
                      : read_given_text(path, &text);
  if (err == ENOENT) {
    f.status = JsonFileStatus::Missing;
    f.error = "cannot open " + path;
    return f;
  }
  if (err != 0) {
    f.status = JsonFileStatus::Unreadable;
    f.error = err == EFBIG ? path + " is larger than 64 MiB: not a config file"
              : err == EINVAL ? path + " is not a regular file"
              : links == LinkPolicy::Refuse ? "cannot read " + path + ": " + own_file_error(err)
                                            : "cannot read " + path + ": " + std::strerror(err);
    return f;
  }
  f.value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (f.value.is_discarded()) {
    f.status = JsonFileStatus::NotJson;
    f.error = path + " is not valid JSON";
  } else if (expect == JsonExpect::Object && !f.value.is_object()) {
    f.status = JsonFileStatus::NotObject;
    f.error = path + " is not a JSON object";
  } else {
    f.status = JsonFileStatus::Ok;
    return f;
  }
  f.value = nlohmann::json();
  return f;
}

nlohmann::json read_json_file(const std::string& path, const std::string& hint, JsonExpect expect) {
  JsonFile f = try_read_json_file(path, expect);
  DF_CHECK_HINT(f.ok(), BadInput, f.error, hint);
  return std::move(f.value);
}

}  // namespace dflash

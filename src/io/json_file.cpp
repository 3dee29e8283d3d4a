// See json_file.h.
#include "io/json_file.h"

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <sstream>

#include "dflash/error.h"

namespace dflash {

JsonFile try_read_json_file(const std::string& path, JsonExpect expect) {
  JsonFile f;
  // A regular file of bounded size only: a config.json linked to /dev/zero grew without bound, a FIFO
  // blocked forever. 64 MiB is far above any config or index file (the largest index is a few MiB).
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || st.st_size > (int64_t{64} << 20))) {
    f.status = JsonFileStatus::Unreadable;
    f.error = path + (S_ISREG(st.st_mode) ? " is larger than 64 MiB: not a config file" : " is not a regular file");
    return f;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    f.status = JsonFileStatus::Missing;
    f.error = "cannot open " + path;
    return f;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    f.status = JsonFileStatus::Unreadable;
    f.error = "cannot read " + path;
    return f;
  }
  f.value = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
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

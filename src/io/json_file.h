// Reading a JSON file: the project's one way (internal header). nlohmann::json parses without exceptions;
// what went wrong is named with the file, through the one fatal path or returned to a caller that
// decides for itself (a checkpoint that may be half-written, an optional generation_config.json).
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "dflash/safe_file.h"  // LinkPolicy

namespace dflash {

enum class JsonExpect { Any, Object };  // Object: anything else is refused as "not a JSON object"
enum class JsonFileStatus { Ok, Missing, Unreadable, NotJson, NotObject };

struct JsonFile {
  JsonFileStatus status = JsonFileStatus::Missing;
  nlohmann::json value;  // the document when status == Ok
  std::string error;     // otherwise: "cannot open PATH", "cannot read PATH", "PATH is not valid JSON", ...
  bool ok() const { return status == JsonFileStatus::Ok; }
};

// The file parsed, or why not (never fatal). LinkPolicy::Refuse for a fixed name under the run directory
// (a checkpoint's manifest, drafter-best/best.json): read through the held descriptor, never through a link
// (a link or a non-regular file there: Unreadable, the error naming it; hard links accepted, as a resume's
// reads accept them: include/dflash/safe_file.h). Either way a FIFO never blocks the open.
JsonFile try_read_json_file(const std::string& path, JsonExpect expect = JsonExpect::Object,
                            LinkPolicy links = LinkPolicy::Follow);

// The file parsed; fatal BadInput with JsonFile::error and `hint` (how to get a good file) otherwise.
nlohmann::json read_json_file(const std::string& path, const std::string& hint, JsonExpect expect = JsonExpect::Object);

}  // namespace dflash

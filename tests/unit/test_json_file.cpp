// The one JSON file reader (src/io/json_file.h): each way a file can fail is told apart and named with the
// path; read_json_file ends through the fatal path (exit 3) with the caller's hint.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "io/json_file.h"
#include "test_support.h"

using namespace dflash;

namespace {
std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST(JsonFile, StatusOfEachKindOfFile) {
  const std::string dir = test::make_temp_dir("dflash-json-test-");
  const JsonFile ok = try_read_json_file(write(dir, "ok.json", R"({"a": 1, "b": [2, 3]})"));
  ASSERT_TRUE(ok.ok()) << ok.error;
  EXPECT_EQ(ok.value.at("a").get<int>(), 1);
  EXPECT_EQ(ok.value.at("b").size(), 2u);

  const JsonFile missing = try_read_json_file(dir + "/absent.json");
  EXPECT_EQ(missing.status, JsonFileStatus::Missing);
  EXPECT_EQ(missing.error, "cannot open " + dir + "/absent.json");

  const JsonFile bad = try_read_json_file(write(dir, "bad.json", "{\"a\": "));
  EXPECT_EQ(bad.status, JsonFileStatus::NotJson);
  EXPECT_EQ(bad.error, dir + "/bad.json is not valid JSON");
  EXPECT_TRUE(bad.value.is_null());

  const std::string arr = write(dir, "arr.json", "[1, 2]");
  EXPECT_EQ(try_read_json_file(arr).status, JsonFileStatus::NotObject);
  EXPECT_EQ(try_read_json_file(arr).error, arr + " is not a JSON object");
  const JsonFile any = try_read_json_file(arr, JsonExpect::Any);
  ASSERT_TRUE(any.ok());
  EXPECT_TRUE(any.value.is_array());
}

TEST(JsonFileDeathTest, ReadJsonFileIsFatalWithTheHint) {
  const std::string dir = test::make_temp_dir("dflash-json-test-");
  const std::string bad = write(dir, "bad.json", "not json");
  EXPECT_EXIT(read_json_file(bad, "write it again"), testing::ExitedWithCode(3), "bad.json is not valid JSON(.|\n)*HINT: write it again");
  EXPECT_EXIT(read_json_file(dir + "/absent.json", "give the path"), testing::ExitedWithCode(3), "cannot open .*absent.json");
  EXPECT_EQ(read_json_file(write(dir, "ok.json", "{\"x\": true}"), "-").at("x"), true);
}

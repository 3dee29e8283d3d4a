// The target's config.json in its content identity (issue 48 item 4), and --target / --data accepted at
// another path when their content identities match (item 9): src/checkpoint/input_identity.cpp,
// src/checkpoint/checkpoint_options.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "dflash/checkpoint.h"
#include "test_support.h"

using namespace dflash;
using testing::ExitedWithCode;

namespace {

std::string target_with_config(const std::string& json) {
  const std::string dir = test::make_temp_dir("dflash_identity_");
  std::ofstream(dir + "/config.json") << json;
  return dir;
}

constexpr const char* kConfig =
    R"({"model_type": "qwen3", "hidden_size": 64, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
        "transformers_version": "4.51.0"})";

}  // namespace

TEST(InputIdentity, TargetConfigCoversTheFieldsTheModelReads) {
  const std::string a = target_config_identity(target_with_config(kConfig));
  // The same values, other formatting and key order, another transformers_version: the same identity.
  const std::string same = target_config_identity(target_with_config(
      R"({"rms_norm_eps":1e-06,"rope_theta":1000000.0,"hidden_size":64,"model_type":"qwen3","transformers_version":"4.57.1"})"));
  EXPECT_EQ(a, same);
  // rope_theta or rms_norm_eps edited in place: another identity, and the change names the field.
  const std::string theta = target_config_identity(target_with_config(
      R"({"model_type": "qwen3", "hidden_size": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-06})"));
  const std::string eps = target_config_identity(target_with_config(
      R"({"model_type": "qwen3", "hidden_size": 64, "rope_theta": 1000000.0, "rms_norm_eps": 1e-05})"));
  EXPECT_NE(a, theta);
  EXPECT_NE(a, eps);
  EXPECT_EQ(describe_identity_change(a, theta), "rope_theta differ");
  EXPECT_EQ(describe_identity_change(a, eps), "rms_norm_eps differ");
}

TEST(InputIdentity, ResumeRefusesAnEditedConfigAndSaysWhenTheCheckpointPredatesIt) {
  const OptionMap saved = {{"target", "/t"}, {kTargetIdentityKey, "shards=1 a=1"}, {kTargetConfigIdentityKey, "fields=1 rope_theta=a1"}};
  OptionMap now = saved;
  now[kTargetConfigIdentityKey] = "fields=1 rope_theta=a2";
  EXPECT_EXIT(check_resume_compatible(saved, now, "ckpt"), ExitedWithCode(3),
              "the target's config.json \\(--target\\) at the same path is not what the checkpoint was trained on: "
              "rope_theta differ");
  // A checkpoint written before config.json was fingerprinted: accepted (its weights match), and said.
  OptionMap old = saved;
  old.erase(kTargetConfigIdentityKey);
  const std::vector<std::string> notes = check_resume_compatible(old, saved, "ckpt");
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("predates config.json fingerprints"), std::string::npos) << notes[0];
}

TEST(InputIdentity, MovedInputsWithTheSameContentResume) {
  const OptionMap saved = {{"target", "/tmp/1/target"},
                           {"data", "/tmp/1/data.h5"},
                           {"loss", "ce"},
                           {kTargetIdentityKey, "shards=1 a=1"},
                           {kTargetConfigIdentityKey, "fields=1 rope_theta=a1"},
                           {kDataIdentityKey, "bytes=10 records=2"}};
  OptionMap now = saved;
  now["target"] = "/tmp/2/target";
  now["data"] = "/tmp/2/data.h5";
  const std::vector<std::string> notes = check_resume_compatible(saved, now, "ckpt");
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0], "--data moved: /tmp/1/data.h5 -> /tmp/2/data.h5, same content");
  EXPECT_EQ(notes[1], "--target moved: /tmp/1/target -> /tmp/2/target, same content");
  // Moved and changed: the path change is refused as before.
  OptionMap changed = now;
  changed[kTargetConfigIdentityKey] = "fields=1 rope_theta=a2";
  EXPECT_EXIT(check_resume_compatible(saved, changed, "ckpt"), ExitedWithCode(2),
              "--target: saved '/tmp/1/target', now '/tmp/2/target'");
  // A checkpoint without identities cannot vouch for another path.
  OptionMap bare = {{"target", "/tmp/1/target"}, {"loss", "ce"}};
  OptionMap bare_now = bare;
  bare_now["target"] = "/tmp/2/target";
  EXPECT_EXIT(check_resume_compatible(bare, bare_now, "ckpt"), ExitedWithCode(2), "--target: saved");
  // Any other option's path still pins: --loss is no input.
  OptionMap loss = now;
  loss["loss"] = "kl";
  EXPECT_EXIT(check_resume_compatible(saved, loss, "ckpt"), ExitedWithCode(2), "--loss: saved 'ce', now 'kl'");
}

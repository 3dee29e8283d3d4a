// --dry-run's plan without mpirun, a GPU or weights (src/runtime/dry_run_plan.h): the GPUs --gpu names, the
// world --ranks / --nodes plan, the target's parameters from config.json, the memory check against a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "dflash/options.h"
#include "dflash/target.h"
#include "dflash/topology.h"
#include "drafter/step_buffers.h"
#include "runtime/dry_run_plan.h"
#include "test_support.h"

using namespace dflash;

TEST(DryRunPlan, KnownGpusAreTheirDriversMemoryAndANumberIsGiB) {
  EXPECT_EQ(parse_planned_gpu("h200").bytes, 143771.0 * 1048576);  // nvidia-smi memory.total, measured here
  EXPECT_EQ(parse_planned_gpu("h200").model, "NVIDIA H200");
  EXPECT_EQ(parse_planned_gpu("h100").bytes, 81559.0 * 1048576);
  EXPECT_EQ(parse_planned_gpu("b200").bytes, 183359.0 * 1048576);
  EXPECT_EQ(parse_planned_gpu("rtx-pro-6000").bytes, 97887.0 * 1048576);
  EXPECT_EQ(parse_planned_gpu("96").bytes, 96.0 * 1073741824);
  EXPECT_EQ(parse_planned_gpu("79.5").name, "79.5 GiB");
  EXPECT_EQ(parse_planned_gpu("79.5").model, "");
}

TEST(DryRunPlanDeath, AnUnknownGpuIsRefusedNamingTheKnownOnes) {
  EXPECT_EXIT(parse_planned_gpu("a100"), testing::ExitedWithCode(2), "unknown --gpu 'a100'(.|\n)*h100, h200, b200 or rtx-pro-6000");
  EXPECT_EXIT(parse_planned_gpu("-4"), testing::ExitedWithCode(2), "unknown --gpu '-4'");
  EXPECT_EXIT(parse_planned_gpu("96GB"), testing::ExitedWithCode(2), "unknown --gpu '96GB'");
}

TEST(DryRunPlan, PlannedWorldSeatsEveryRankOnItsNodeAndTheRolesFollow) {
  const PlannedWorld w = planned_world(2, 4, Device::CUDA);
  EXPECT_EQ(w.source, WorldSource::Planned);
  ASSERT_EQ(w.seats.size(), 8u);
  EXPECT_EQ(w.seats[5].node, 1);
  EXPECT_EQ(w.seats[5].local_rank, 1);
  EXPECT_EQ(w.seats[5].gpu, 1);
  EXPECT_EQ(w.seats[5].host, "");
  const Topology t = assign_roles(0, w.slots(), TopologySpec{3, 1});  // the job's own role assignment
  EXPECT_EQ(t.targets, (std::vector<int>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(t.drafters, (std::vector<int>{3, 7}));
  EXPECT_EQ(planned_world(1, 2, Device::CPU).seats[1].gpu, -1);
  EXPECT_EQ(rank_ranges({0, 1, 2, 4, 5, 6}), "0-2,4-6");
  EXPECT_EQ(rank_ranges({7}), "7");
  EXPECT_EQ(rank_ranges({3, 7}), "3,7");
}

namespace {
TargetConfig config_of(const std::string& json) {
  const std::string dir = test::make_temp_dir("dflash-dry-plan-");
  std::ofstream(dir + "/config.json") << json;
  return load_target_config(dir);
}
}  // namespace

TEST(DryRunPlan, TargetParametersFromConfigJson) {
  // Qwen3-8B: 8.19 B parameters (HF's count: 8,190,735,360).
  const TargetConfig q8 = config_of(
      R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
          "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
          "vocab_size": 151936, "tie_word_embeddings": false, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
          "torch_dtype": "bfloat16"})");
  EXPECT_EQ(target_param_count(q8), 8190735360.0);
  {  // --target-precision fp8 (docs/fp8.md): the decoder linears at 1 byte + scales on every GPU kind; where
     // the kind has no block-scaled FP8 GEMM (B200) plus one bf16 scratch of the largest linear, gate|up
     // [2 x 12288, 4096] = 100,663,296 weights = 201,326,592 B; the CPU backend dequantizes at load.
    TargetConfig fp8 = q8;
    fp8.quant.precision = TargetPrecision::Fp8;
    const TargetParams p = target_params(fp8);
    EXPECT_EQ(p.fp8_linear, 36 * (4096.0 * (4096 + 2 * 1024 + 4096) + 3 * 4096.0 * 12288));
    EXPECT_EQ(p.fp8_largest_linear, 100663296.0);
    Options o;
    o.target_dir = test::make_temp_dir("dflash-dry-plan-fp8-");  // no weights: counted from config.json
    o.backend = Device::CUDA;
    o.plan_gpu = "h100";
    const TargetWeights h100 = target_weights(o, fp8);
    EXPECT_DOUBLE_EQ(h100.bytes, (p.total - p.fp8_linear) * 2 + p.fp8_linear * (1 + 4.0 / 128));
    EXPECT_NE(h100.source.find("e4m3 codes"), std::string::npos) << h100.source;
    o.plan_gpu = "b200";
    const TargetWeights b200 = target_weights(o, fp8);
    EXPECT_DOUBLE_EQ(b200.bytes, h100.bytes + 201326592.0);
    EXPECT_NE(b200.source.find("dequantized per GEMM"), std::string::npos) << b200.source;
    // compressed-tensors' per-token activations over channel scales: the per-token FP8 GEMM on an H100 (no
    // scratch, bench/results/h100-issue46-fp8tok-20261206c), the scratch on a B200; fp8-dynamic alike.
    TargetConfig ct = fp8;
    ct.quant.format = CheckpointFp8::CompressedTensors;
    ct.quant.scales = WeightScales::Channels;
    ct.quant.act_group = 0;
    o.plan_gpu = "h100";
    const TargetWeights ct_h100 = target_weights(o, ct);
    EXPECT_DOUBLE_EQ(ct_h100.bytes, h100.bytes);
    EXPECT_NE(ct_h100.source.find("per-token FP8 GEMM"), std::string::npos) << ct_h100.source;
    TargetConfig dyn = fp8;
    dyn.quant.on_load = OnLoadFp8::Dynamic;
    EXPECT_DOUBLE_EQ(target_weights(o, dyn).bytes, h100.bytes);
    o.plan_gpu = "b200";
    EXPECT_DOUBLE_EQ(target_weights(o, ct).bytes, b200.bytes);
    // per-token activations over block scales: no FP8 GEMM takes them, the scratch on an H100 too.
    TargetConfig ct_blocks = ct;
    ct_blocks.quant.scales = WeightScales::Blocks;
    o.plan_gpu = "h100";
    EXPECT_DOUBLE_EQ(target_weights(o, ct_blocks).bytes, b200.bytes);
    // Blocks of another width than 128 columns: dequantized at load, bf16.
    TargetConfig wide = fp8;
    wide.quant.format = CheckpointFp8::FineGrained;
    wide.quant.block_cols = 64;
    EXPECT_DOUBLE_EQ(target_weights(o, wide).bytes, p.total * 2);
    o.backend = Device::CPU;
    const TargetWeights cpu = target_weights(o, fp8);
    EXPECT_DOUBLE_EQ(cpu.bytes, p.total * 4);
    EXPECT_NE(cpu.source.find("dequantized to F32"), std::string::npos) << cpu.source;
  }
  {  // Qwen3.6-27B FP8 on an RTX PRO 6000 (bench/bench_hybrid_forward.cpp's shape: H 5120, I 17408, V 248320,
     // 48 GDN + 16 attention layers). By hand: FP8 linears per GDN layer H(2K + Vd) + H Vd + Vd H =
     // 5120 x 10240 + 2 x 5120 x 6144 = 115,343,360 (in_proj_a/b stay bf16), per attention layer
     // 3 x H x 6144 + 2 x H x 1024 = 104,857,600, MLP 3 x H x I = 267,386,880 per layer: 24,326,963,200
     // in all, of 26,895,998,464 parameters. Bytes: 2,569,035,264 x 2 (bf16) + 24,326,963,200 x (1 + 4/128)
     // + the scratch of gate|up, 2 x 17408 x 5120 x 2 B = 356,515,840: 30,581,767,168 B = 28.5 GiB (50.1 GiB
     // with the weights dequantized at load, as before Fp8Dequant); on an H200 (the GEMM) no scratch.
    TargetConfig q27 = config_of(
        R"({"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": 248320,
            "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
            "num_key_value_heads": 4, "head_dim": 256, "hidden_act": "silu", "attn_output_gate": true,
            "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
            "partial_rotary_factor": 0.25}, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})");
    q27.quant.precision = TargetPrecision::Fp8;
    const TargetParams p = target_params(q27);
    EXPECT_EQ(p.total, 26895998464.0);
    EXPECT_EQ(p.fp8_linear, 24326963200.0);
    EXPECT_EQ(p.fp8_largest_linear, 178257920.0);
    Options o;
    o.target_dir = test::make_temp_dir("dflash-dry-plan-fp8-27b-");
    o.backend = Device::CUDA;
    o.plan_gpu = "rtx-pro-6000";
    EXPECT_DOUBLE_EQ(target_weights(o, q27).bytes, 30581767168.0);
    o.plan_gpu = "h200";
    EXPECT_DOUBLE_EQ(target_weights(o, q27).bytes, 30581767168.0 - 356515840.0);
  }
  // The golden targets, dense and hybrid (Gated DeltaNet layers; float32): their index's total_size is
  // exactly these parameters x 4 bytes. Without the shards the index says it; without the index, config.json.
  for (const char* c : {"qwen3-tiny-a", "qwen35-tiny-a"}) {
    const std::string dir = std::string(DFLASH_TEST_DATA) + "/golden/" + c + "/target";
    Options o;
    o.target_dir = dir;
    o.backend = Device::CUDA;
    const TargetConfig t = load_target_config(dir);
    const TargetWeights shards = target_weights(o, t);
    EXPECT_NE(shards.source.find("of safetensors"), std::string::npos) << shards.source;
    o.target_dir = test::make_temp_dir("dflash-dry-plan-");
    std::ofstream(o.target_dir + "/config.json") << std::ifstream(dir + "/config.json").rdbuf();
    std::ofstream(o.target_dir + "/model.safetensors.index.json") << std::ifstream(dir + "/model.safetensors.index.json").rdbuf();
    const TargetWeights index = target_weights(o, t);
    EXPECT_NE(index.source.find("by model.safetensors.index.json"), std::string::npos) << index.source;
    EXPECT_EQ(index.file_bytes, 4 * target_param_count(t)) << c;
    EXPECT_LT(index.file_bytes, shards.file_bytes) << "the shards add their headers";
    std::remove((o.target_dir + "/model.safetensors.index.json").c_str());
    const TargetWeights config = target_weights(o, t);
    EXPECT_NE(config.source.find("config.json's"), std::string::npos) << config.source;
    EXPECT_EQ(config.file_bytes, index.file_bytes) << c;
    EXPECT_EQ(config.bytes, config.file_bytes / 2) << "a float32 checkpoint in bf16 on CUDA";
    o.backend = Device::CPU;
    EXPECT_EQ(target_weights(o, t).bytes, config.file_bytes) << "float32 on the CPU";
  }
}

TEST(DryRunPlan, TheMemoryCheckNamesTheRanksThatDoNotFit) {
  Options o;
  o.backend = Device::CUDA;
  o.plan_gpu = "40";
  RoleMemory m;
  m.target = 16.5 * 1073741824.0;
  m.drafter = 67.9 * 1073741824.0;
  const MemoryVerdict v = check_memory(o, parse_planned_gpu("40"), m, {0, 1, 2, 3, 4, 5, 6}, {7});
  EXPECT_FALSE(v.fits);
  EXPECT_EQ(v.line, "[dflash] memory check against --gpu 40 (40.0 GiB): target rank(s) 0-6: 16.5 GiB fixed, 23.5 GiB "
                    "left for the activations; drafter rank(s) 7: 67.9 GiB fixed: does NOT fit");
  EXPECT_EQ(v.what, "the plan does not fit --gpu 40 (40.0 GiB): drafter rank(s) 7 need 67.9 GiB of fixed memory, more "
                    "than the GPU's 40.0 GiB");
  o.plan_gpu = "h200";
  const MemoryVerdict fits = check_memory(o, parse_planned_gpu("h200"), m, {0, 1, 2, 3, 4, 5, 6}, {7});
  EXPECT_TRUE(fits.fits);
  EXPECT_NE(fits.line.find("--gpu h200 (NVIDIA H200, 140.4 GiB as its driver reports it)"), std::string::npos) << fits.line;
  // --topology auto: the roles are not known yet, each is checked as "a ... rank"
  const MemoryVerdict any = check_memory(o, parse_planned_gpu("h200"), m, {}, {});
  EXPECT_NE(any.line.find("a target rank: 16.5 GiB fixed"), std::string::npos) << any.line;
  // Nothing named on a machine without NVML, and the CPU backend's host memory: no check, and it says so.
  o.plan_gpu.clear();
  EXPECT_TRUE(check_memory(o, PlannedGpu{}, m, {0}, {1}).fits);
  EXPECT_NE(check_memory(o, PlannedGpu{}, m, {0}, {1}).line.find("give --gpu"), std::string::npos);
  o.backend = Device::CPU;
  EXPECT_EQ(check_memory(o, PlannedGpu{}, m, {0}, {1}).line, "[dflash] memory check: none (--backend cpu: host memory)");
}

// The drafter's block activations come from the step's own buffer list (drafter/step_buffers.h): an
// 8B-shaped DFlash drafter (5 layers, H 4096, I 12288, 32/8 heads x 128, B 16) counted by hand from it.
TEST(DryRunPlan, DrafterBytesPerAnchorSumTheStepsBuffers) {
  DrafterConfig d;
  d.layers.hidden_size = 4096;
  d.layers.intermediate_size = 12288;
  d.layers.num_attention_heads = 32;
  d.layers.num_key_value_heads = 8;
  d.layers.head_dim = 128;
  d.layers.num_hidden_layers = 5;
  d.block_size = 16;
  d.target_layer_ids = {1, 9, 17, 25, 33};
  const double H = 4096, I = 12288, QD = 4096, KV = 1024, B = 16;
  const double layer = (4 * H + 3 * QD + 3 * KV + 3 * I) * 2 + (2 + 2 * 32 + 8) * 4.0;
  const double shared = (7 * H + 3 * I + 3 * QD + 3 * KV) * 2 + 3 * 4.0;  // block rows, the backward's scratch
  const double loss_row = 3 * H * 2 + 8 * 4.0;
  EXPECT_DOUBLE_EQ(drafter_bytes_per_anchor(d, true), B * (5 * layer + shared) + (B - 1) * loss_row + 2 * 4.0);
  EXPECT_GT(drafter_bytes_per_anchor(d, false), drafter_bytes_per_anchor(d, true));  // float32 activations

  // Every buffer has a name of its own (the CUDA step finds its members by them); DFlash2 only adds.
  const std::vector<train::StepBuffer> dflash = train::drafter_step_buffers(d);
  d.arch = DraftArch::DFlash2;
  const std::vector<train::StepBuffer> d2 = train::drafter_step_buffers(d);
  std::set<std::string> names;
  for (const train::StepBuffer& b : d2) EXPECT_TRUE(names.insert(b.name).second) << b.name;
  EXPECT_GT(d2.size(), dflash.size());
  // The allocation's floor: a byte mask of at least 16, 16-byte vectors of bf16.
  for (const train::StepBuffer& b : d2)
    if (b.name == "covered") EXPECT_EQ(b.elements(1, 1, 2), 16);
  EXPECT_EQ(dflash.front().elements(0, 0, 16), 8);
}

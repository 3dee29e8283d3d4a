#!/usr/bin/env bash
# A target the code does not implement is refused at startup naming the field (exit 3), instead of
# loading and training silently wrong: another family or an MoE (model_type, architectures), biases,
# an activation other than SiLU, quantized weights other than FP8 (and an FP8 config over bf16 weights),
# and weights of more layers than config.json says.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
# variant NAME 'python statement on the config dict c': a copy of the tiny target with that config.
variant() {
  mkdir -p "$WORK/$1"
  cp "$tiny/target/"* "$WORK/$1/"
  "$PY" -c "
import json, sys
p = sys.argv[1] + '/config.json'
c = json.load(open(p))
$2
json.dump(c, open(p, 'w'), indent=2)
" "$WORK/$1"
}
case_rc() {  # case_rc NAME WANT_RC "message"
  run_job "$1.run" 2 60 --topology 1-1 --max-steps 2 --target "$WORK/$1"
  expect_rc "$2" "$1.run"
  expect_log "$1.run" "$3"
}
variant moe "c['model_type'] = 'qwen3_moe'; c['architectures'] = ['Qwen3MoeForCausalLM']"
case_rc moe 3 "field 'model_type' in $WORK/moe/config.json is \"qwen3_moe\", a model this build does not implement"
variant llama "c['architectures'] = ['LlamaForCausalLM']"
case_rc llama 3 "field 'architectures' in $WORK/llama/config.json names \"LlamaForCausalLM\""
variant bias "c['attention_bias'] = True"
case_rc bias 3 "field 'attention_bias' in $WORK/bias/config.json is true: this build's Qwen layers have no biases"
variant gelu "c['hidden_act'] = 'gelu'"
case_rc gelu 3 "field 'hidden_act' in $WORK/gelu/config.json is \"gelu\""
variant awq "c['quantization_config'] = {'quant_method': 'awq', 'bits': 4}"
case_rc awq 3 "field 'quantization_config' in $WORK/awq/config.json is set (quant_method \"awq\")"
# An FP8 config over bf16 weights: the config and the weights describe different models (docs/fp8.md).
variant fp8 "c['quantization_config'] = {'quant_method': 'fp8', 'weight_block_size': [128, 128]}"
case_rc fp8 3 "has an FP8 quantization_config, fp8 (fine-grained), but none of the checkpoint's 28 decoder linear tensors is stored F8_E4M3"
# The weights have 4 decoder layers; a config that says 3 would silently drop the last one.
variant shallow "c['num_hidden_layers'] = 3; c.pop('layer_types', None); c.pop('max_window_layers', None)"
case_rc shallow 3 "holds model.layers.3."
expect_log shallow.run "but its config.json has num_hidden_layers = 3"
echo "PASS"

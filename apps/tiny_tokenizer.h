// The tiny target's tokenizer (dflash-make-tiny): a byte-level BPE in Hugging Face's format
// (tokenizer.json + tokenizer_config.json with a Qwen3-style chat template), so dflash-tokenize and
// dflash-regenerate can be tried on the model a newcomer has. Its merges are learnt here, deterministically,
// from a few English sentences; its ids stay below the target's vocabulary and leave the last id free (the
// default mask token of a fresh drafter, --mask-token auto = vocab-1 for this family). The same layout as
// tests/data_tools/make_tiny_tokenizer.py builds with the `tokenizers` library: 5 special tokens, the 256
// byte symbols, then the merges.
#pragma once
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/safetensors.h"  // write_file_atomic

namespace dflash {

// The special tokens, ids 0..4 (<think> and </think> are text the model writes, as in Qwen3).
inline const std::vector<std::pair<std::string, bool>>& tiny_tokenizer_specials() {
  static const std::vector<std::pair<std::string, bool>> s = {
      {"<|endoftext|>", true}, {"<|im_start|>", true}, {"<|im_end|>", true}, {"<think>", false}, {"</think>", false}};
  return s;
}

// Qwen3's chat rules, shortened (make_tiny_tokenizer.py --template qwen3): the empty <think></think> block on
// the last assistant turn after the last user message, enable_thinking=false closing it in the generation
// prompt.
inline const char* tiny_chat_template() {
  return "{%- set ns = namespace(last_query_index=-1) %}"
         "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}"
         "{%- endfor %}"
         "{%- for message in messages %}"
         "{%- if message.role == 'assistant' %}"
         "{%- set content = message.content %}{%- set reasoning_content = '' %}"
         "{%- if '</think>' in content %}"
         "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
         "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
         "{%- endif %}"
         "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
         "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' "
         "+ content.lstrip('\\n') }}"
         "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
         "{{- '<|im_end|>\\n' }}"
         "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
         "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
         "{%- endif %}";
}

// GPT-2's byte -> printable character table (UTF-8), in which byte-level BPE vocabularies are written.
inline std::vector<std::string> byte_level_symbols() {
  std::vector<int> cp(256, -1);
  for (int b = 0; b < 256; ++b)
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) cp[b] = b;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (cp[b] < 0) cp[b] = 256 + n++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const int c = cp[b];
    std::string s;
    if (c < 0x80) s += static_cast<char>(c);
    else {  // every code point here is below 0x800: two bytes
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

// Splits text as the ByteLevel pre-tokenizer's GPT-2 pattern does for ASCII
// ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), bytes >= 0x80 counted as
// letters: the words the merges are learnt within (merges across HF's own pieces would never apply).
inline std::vector<std::string> tiny_pretokenize(const std::string& t) {
  auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  auto letter = [](unsigned char c) { return c >= 0x80 || std::isalpha(c) != 0; };
  auto digit = [](unsigned char c) { return std::isdigit(c) != 0; };
  std::vector<std::string> out;
  const size_t n = t.size();
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    if (t[i] == '\'') {
      bool matched = false;
      for (const char* c : {"s", "t", "re", "ve", "m", "ll", "d"})
        if (t.compare(i + 1, std::string(c).size(), c) == 0) {
          j = i + 1 + std::string(c).size();
          matched = true;
          break;
        }
      if (matched) {
        out.push_back(t.substr(i, j - i));
        i = j;
        continue;
      }
    }
    if (t[j] == ' ' && j + 1 < n && !space(t[j + 1])) ++j;
    const unsigned char c = static_cast<unsigned char>(t[j]);
    if (!space(c)) {
      auto same = letter(c) ? +[](unsigned char x) { return x >= 0x80 || std::isalpha(x) != 0; }
                  : digit(c) ? +[](unsigned char x) { return std::isdigit(x) != 0; }
                             : +[](unsigned char x) { return !std::isspace(x) && x < 0x80 && !std::isalnum(x); };
      while (j < n && same(static_cast<unsigned char>(t[j]))) ++j;
    } else {
      while (j < n && space(static_cast<unsigned char>(t[j]))) ++j;
      if (j < n && j - i > 1) --j;  // \s+(?!\S): the last space goes with the next word
    }
    out.push_back(t.substr(i, j - i));
    i = j;
  }
  return out;
}

// Byte-level BPE trained on `corpus` up to `size` tokens (specials + 256 bytes + merges): the most frequent
// adjacent pair is merged first, ties broken by the pair's text, so the same tokenizer comes out everywhere.
// Returns the merges in order, as (left, right) symbol strings.
inline std::vector<std::pair<std::string, std::string>> train_tiny_bpe(const std::vector<std::string>& corpus,
                                                                       int merges_wanted) {
  const std::vector<std::string> sym = byte_level_symbols();
  std::map<std::vector<std::string>, long> words;
  for (const std::string& text : corpus)
    for (const std::string& piece : tiny_pretokenize(text)) {
      std::vector<std::string> w;
      for (unsigned char b : piece) w.push_back(sym[b]);
      words[w]++;
    }
  std::vector<std::pair<std::string, std::string>> merges;
  while (static_cast<int>(merges.size()) < merges_wanted) {
    std::map<std::pair<std::string, std::string>, long> pairs;
    for (const auto& [w, count] : words)
      for (size_t k = 0; k + 1 < w.size(); ++k) pairs[{w[k], w[k + 1]}] += count;
    auto best = pairs.end();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (best == pairs.end() || it->second > best->second) best = it;  // first of the ties: the smallest pair
    if (best == pairs.end()) break;  // every word is one token
    const auto [a, b] = best->first;
    merges.push_back({a, b});
    std::map<std::vector<std::string>, long> merged;
    for (const auto& [w, count] : words) {
      std::vector<std::string> m;
      for (size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == a && w[k + 1] == b) {
          m.push_back(a + b);
          ++k;
        } else {
          m.push_back(w[k]);
        }
      }
      merged[m] += count;
    }
    words.swap(merged);
  }
  return merges;
}

// The fewest ids a tokenizer needs: the specials and the 256 bytes, plus the mask token's free id.
inline int tiny_tokenizer_min_vocab() { return static_cast<int>(tiny_tokenizer_specials().size()) + 256 + 1; }

// Writes dir/tokenizer.json and dir/tokenizer_config.json for a target of `vocab` rows: at most
// min(400, vocab - 1) tokens. Returns the tokenizer's size. The caller checks vocab >= tiny_tokenizer_min_vocab().
inline int write_tiny_tokenizer(const std::string& dir, int vocab, int model_max_length) {
  static const std::vector<std::string> kCorpus = {
      "The quick brown fox jumps over the lazy dog.",
      "What is the capital of France? The capital of France is Paris.",
      "Please write a short poem about the sea and the sky.",
      "def add(a, b):\n    return a + b\n",
      "Two plus two is four. Three times three is nine.",
      "You are a helpful assistant. Answer the question briefly.",
      "Hello! How can I help you today? Tell me a story about a dragon.",
      "Sure, here is a list: apples, oranges, bananas, and pears.",
      "Let me think step by step about the question before answering.",
      "system\nuser\nassistant\n",
  };
  const auto& specials = tiny_tokenizer_specials();
  const int n_base = static_cast<int>(specials.size()) + 256;
  const int size = std::min(400, vocab - 1);
  const auto merges = train_tiny_bpe(kCorpus, size - n_base);

  nlohmann::ordered_json vocab_json = nlohmann::ordered_json::object(), added = nlohmann::ordered_json::array();
  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  int id = 0;
  for (const auto& [content, special] : specials) {
    vocab_json[content] = id;
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", special}});
    decoder[std::to_string(id)] = {{"content", content}, {"lstrip", false}, {"normalized", false},
                                   {"rstrip", false}, {"single_word", false}, {"special", special}};
    ++id;
  }
  std::vector<std::string> bytes = byte_level_symbols();
  std::sort(bytes.begin(), bytes.end(), [](const std::string& x, const std::string& y) {
    auto cp = [](const std::string& s) {  // code point of a one- or two-byte UTF-8 symbol
      return s.size() == 1 ? int(static_cast<unsigned char>(s[0]))
                           : ((static_cast<unsigned char>(s[0]) & 0x1F) << 6) | (static_cast<unsigned char>(s[1]) & 0x3F);
    };
    return cp(x) < cp(y);
  });
  for (const std::string& b : bytes) vocab_json[b] = id++;
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const auto& [a, b] : merges) {
    vocab_json[a + b] = id++;
    merge_list.push_back(a + " " + b);  // the "a b" form every tokenizers version reads (no symbol holds a space)
  }
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::ordered_json tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added;
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = byte_level;
  tok["post_processor"] = nullptr;
  tok["decoder"] = byte_level;
  tok["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                  {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab_json}, {"merges", merge_list}};
  write_file_atomic(dir + "/tokenizer.json", tok.dump(2) + "\n");

  nlohmann::ordered_json cfg;
  cfg["add_bos_token"] = false;
  cfg["add_prefix_space"] = false;
  cfg["added_tokens_decoder"] = decoder;
  cfg["bos_token"] = nullptr;
  cfg["chat_template"] = tiny_chat_template();
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = "<|im_end|>";
  cfg["model_max_length"] = model_max_length;
  cfg["pad_token"] = "<|endoftext|>";
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  cfg["unk_token"] = nullptr;
  write_file_atomic(dir + "/tokenizer_config.json", cfg.dump(2) + "\n");
  return id;
}

}  // namespace dflash

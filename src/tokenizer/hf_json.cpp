// tokenizer/hf_json.cpp — reads a Hugging Face tokenizer.json (byte-level BPE, or
// SentencePiece-style BPE with byte fallback as Gemma, Llama 2 and Mistral ship it) and the
// tokenizer_config.json beside it into a TokenizerSpec.
#include <cctype>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/models.h"
#include "tokenizer/pretokenize.h"

namespace fp {

namespace {
using nlohmann::json;

json parse_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FP_CHECK(in, path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // Real tokenizer files nest a handful of levels; reject deep nesting before anything recurses
  // over it (copies, the pre-tokenizer walk).
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  FP_CHECK(max_depth <= 64, path, ": JSON nested ", max_depth, " levels deep (more than 64): not a tokenizer file");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

// A regex matching `s` literally.
std::string escape_regex(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-").find(c) != std::string_view::npos) r += '\\';
    r += c;
  }
  return r;
}

struct PreState {
  std::vector<std::string> regexes;
  bool byte_level = false;
  bool add_prefix_space = false;
};

void read_pre(const json& p, const std::string& path, PreState& st) {
  if (p.is_null()) return;
  FP_CHECK(p.is_object() && p.contains("type"), path, ": pre_tokenizer entry without a type");
  const std::string type = p["type"].get<std::string>();
  if (type == "Sequence") {
    FP_CHECK(p.contains("pretokenizers") && p["pretokenizers"].is_array(), path, ": pre_tokenizer Sequence without pretokenizers");
    for (const auto& q : p["pretokenizers"]) read_pre(q, path, st);
  } else if (type == "Split") {
    const std::string behavior = p.value("behavior", "Isolated");
    FP_CHECK(behavior == "Isolated", path, ": pre_tokenizer Split behavior '", behavior, "' is not supported (only Isolated)");
    FP_CHECK(p.contains("pattern") && p["pattern"].is_object(), path, ": pre_tokenizer Split without a pattern");
    const json& pat = p["pattern"];
    if (pat.contains("Regex")) st.regexes.push_back(pat["Regex"].get<std::string>());
    else if (pat.contains("String")) st.regexes.push_back(escape_regex(pat["String"].get<std::string>()));
    else fail(path, ": pre_tokenizer Split pattern is neither Regex nor String");
    // invert does not change the pieces of an Isolated split (matches and gaps both stay).
  } else if (type == "Digits") {
    st.regexes.push_back(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else if (type == "ByteLevel") {
    st.byte_level = true;
    if (p.value("add_prefix_space", false)) st.add_prefix_space = true;
    if (p.value("use_regex", true)) st.regexes.push_back(kGpt2Pattern);
  } else {
    fail(path, ": pre_tokenizer type '", type, "' is not supported (supported: Sequence, Split, Digits, ByteLevel)");
  }
}

void read_normalizer(const json& n, const std::string& path, std::string& out) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& m : n.value("normalizers", json::array())) read_normalizer(m, path, out);
  } else if (type == "NFC") {
    out = "NFC";
  } else {
    fail(path, ": normalizer type '", type, "' is not supported (supported: NFC, Sequence)");
  }
}

// A SentencePiece-style tokenizer.json (transformers' GemmaConverter / LlamaConverter): spaces
// become "▁" by a Replace normalizer or a Metaspace pre-tokenizer, a "▁" goes before the text by
// a Prepend normalizer or Metaspace's prepend_scheme, and the BPE falls back to <0xNN> bytes.
struct SpmJson {
  bool spm = false;            // some part says so (Replace " " -> "▁", Prepend "▁", Metaspace)
  bool escapes_spaces = false;
  bool prefix = false, first_only = false, unless_space = false;
};
const std::string kMeta = "\xE2\x96\x81";  // "▁"

void read_spm_normalizer(const json& n, const std::string& path, SpmJson& st, std::vector<std::string>& other) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& m : n.value("normalizers", json::array())) read_spm_normalizer(m, path, st, other);
  } else if (type == "Replace" && n.contains("pattern") && n["pattern"].is_object() && n["pattern"].value("String", "") == " " &&
             n.value("content", "") == kMeta) {
    st.spm = st.escapes_spaces = true;
  } else if (type == "Prepend" && n.value("prepend", "") == kMeta) {
    st.spm = st.prefix = true;  // before every run of text between added tokens
  } else {
    other.push_back(type == "Replace" || type == "Prepend" ? type + " " + n.dump() : type);
  }
}

void read_spm_pre(const json& p, const std::string& path, SpmJson& st, std::vector<std::string>& other) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& q : p.value("pretokenizers", json::array())) read_spm_pre(q, path, st, other);
  } else if (type == "Metaspace") {
    st.spm = true;
    FP_CHECK(p.value("replacement", kMeta) == kMeta, path, ": Metaspace replacement ", p["replacement"].dump(),
             " (only \"▁\" is supported)");
    FP_CHECK(!p.value("split", false), path, ": Metaspace with split: true is not supported");
    st.escapes_spaces = true;
    const std::string scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
    FP_CHECK(scheme == "always" || scheme == "first" || scheme == "never", path, ": Metaspace prepend_scheme '", scheme, "'");
    if (scheme != "never") {
      st.prefix = st.unless_space = true;
      st.first_only = scheme == "first";
    }
  } else if (type == "Split" && p.contains("pattern") && p["pattern"].is_object() && p["pattern"].value("String", "") == " " &&
             p.value("behavior", "") == "MergedWithPrevious") {
    // Gemma: splits at spaces the normalizer has already turned into "▁": nothing to split.
    FP_CHECK(st.escapes_spaces, path, ": a Split at spaces that no normalizer replaced is not supported");
  } else {
    other.push_back(type);
  }
}

// bos_token / eos_token in tokenizer_config.json: a string, {"content": ...}, or null.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return {};
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}
}  // namespace

namespace {
std::unique_ptr<Tokenizer> from_hf_json_checked(const std::string& path);
}  // namespace

// Any JSON value of an unexpected type inside the file becomes an error naming the file.
std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& path) {
  try {
    return from_hf_json_checked(path);
  } catch (const json::exception& e) {
    fail(path, ": unexpected JSON structure: ", e.what());
  }
}

namespace {
std::unique_ptr<Tokenizer> from_hf_json_checked(const std::string& path) {
  const json j = parse_json_file(path);
  FP_CHECK(j.is_object(), path, ": top level is not a JSON object");
  FP_CHECK(j.contains("model") && j["model"].is_object(), path, ": missing field 'model'");
  const json& m = j["model"];
  const std::string mtype = m.value("type", m.contains("merges") ? "BPE" : "");
  FP_CHECK(mtype == "BPE", path, ": model.type '", mtype, "' is not supported (only BPE)");
  FP_CHECK(m.contains("vocab") && m["vocab"].is_object(), path, ": missing field 'model.vocab'");
  FP_CHECK(m.contains("merges") && m["merges"].is_array(), path, ": missing field 'model.merges'");

  TokenizerSpec s;
  s.source = path;
  s.pre = "tokenizer.json";
  try {
    // ids: vocab, then added tokens (which may extend past it or respell an entry).
    // Ids are dense in real files; a bound from the entry count keeps a corrupt id from
    // allocating gigabytes.
    const int64_t kMaxId = 2 * static_cast<int64_t>(m["vocab"].size() + j.value("added_tokens", json::array()).size()) + 1024;
    auto place = [&](int64_t id, const std::string& text, TokenType type, const char* field) {
      FP_CHECK(id >= 0 && id < kMaxId, path, ": ", field, " id ", id, " for '", text, "' is out of range");
      if (id >= static_cast<int64_t>(s.tokens.size())) {
        s.tokens.resize(id + 1);
        s.types.resize(id + 1, static_cast<int32_t>(TokenType::Unused));
      }
      s.tokens[id] = text;
      s.types[id] = static_cast<int32_t>(type);
    };
    for (const auto& [text, id] : m["vocab"].items()) {
      FP_CHECK(id.is_number_integer(), path, ": model.vocab['", text, "'] is not an integer id");
      place(id.get<int64_t>(), text, TokenType::Normal, "model.vocab");
    }
    for (const auto& a : j.value("added_tokens", json::array())) {
      FP_CHECK(a.contains("id") && a.contains("content"), path, ": added_tokens entry without id or content");
      // A number past int64 parses as a double; converting that would be undefined, so refuse it.
      FP_CHECK(a["id"].is_number_integer(), path, ": added_tokens id ", a["id"].dump(), " is not an integer id");
      place(a["id"].get<int64_t>(), a["content"].get<std::string>(),
            a.value("special", false) ? TokenType::Control : TokenType::UserDefined, "added_tokens");
    }
    s.merges.reserve(m["merges"].size());
    for (const auto& e : m["merges"]) {
      if (e.is_string()) {
        s.merges.push_back(e.get<std::string>());
      } else {
        FP_CHECK(e.is_array() && e.size() == 2, path, ": model.merges entry ", s.merges.size(), " is not 'a b' or [a, b]");
        s.merges.push_back(e[0].get<std::string>() + " " + e[1].get<std::string>());
      }
    }
    s.ignore_merges = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = m["vocab"].find(m["unk_token"].get<std::string>());
      if (it != m["vocab"].end()) s.unk_id = it->get<int32_t>();
    }

    SpmJson spm;
    std::vector<std::string> spm_other;
    read_spm_normalizer(j.value("normalizer", json()), path, spm, spm_other);
    read_spm_pre(j.value("pre_tokenizer", json()), path, spm, spm_other);
    if (spm.spm || m.value("byte_fallback", false)) {
      // SentencePiece-style: the SPM model with the file's ranked merges (spm.cpp).
      FP_CHECK(spm_other.empty(), path, ": SentencePiece-style tokenizer.json with ", spm_other.front(),
               " (supported: Replace \" \" -> \"▁\", Prepend \"▁\", Metaspace, Gemma's Split at spaces)");
      FP_CHECK(spm.escapes_spaces, path, ": SentencePiece-style tokenizer.json that does not turn spaces into \"▁\"");
      s.model = "llama";
      s.pre = "default";
      s.add_space_prefix = spm.prefix;
      s.space_prefix_first_only = spm.first_only;
      s.space_prefix_unless_space = spm.unless_space;
      for (size_t i = 0; i < s.tokens.size(); ++i) {  // <0xNN>: the byte-fallback tokens
        const std::string& t = s.tokens[i];
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
            std::isxdigit(static_cast<unsigned char>(t[4])) && s.types[i] == static_cast<int32_t>(TokenType::Normal))
          s.types[i] = static_cast<int32_t>(TokenType::Byte);
      }
    } else {
      read_normalizer(j.value("normalizer", json()), path, s.normalizer);
      PreState pre;
      read_pre(j.value("pre_tokenizer", json()), path, pre);
      const json dec = j.value("decoder", json());
      const bool byte_level_decoder = dec.is_object() && dec.value("type", "") == "ByteLevel";
      FP_CHECK(pre.byte_level || byte_level_decoder, path,
               ": only byte-level BPE and SentencePiece-style (byte fallback, \"▁\" for spaces) tokenizer.json files are "
               "supported");
      s.model = "gpt2";
      s.pre_regexes = pre.regexes.empty() ? std::vector<std::string>{R"([\s\S]+)"} : pre.regexes;
      s.pre_add_prefix_space = pre.add_prefix_space;
      s.add_space_prefix = false;
    }
    s.add_bos = false;

    // BOS from a TemplateProcessing post-processor ("single": [SpecialToken, Sequence A]), and a
    // token appended after the text ("single": [..., Sequence A, SpecialToken]: Qwen3-Embedding).
    std::function<void(const json&)> read_post = [&](const json& p) {
      if (!p.is_object()) return;
      const std::string t = p.value("type", "");
      if (t == "Sequence") {
        for (const auto& q : p.value("processors", json::array())) read_post(q);
      } else if (t == "TemplateProcessing" && p.contains("single") && p["single"].is_array() && !p["single"].empty()) {
        const json& first = p["single"][0];
        if (first.contains("SpecialToken")) {
          const std::string tok = first["SpecialToken"].value("id", "");
          for (size_t i = 0; i < s.tokens.size(); ++i)
            if (s.tokens[i] == tok) { s.bos_id = static_cast<int32_t>(i); s.add_bos = true; }
        }
        const json& last = p["single"].back();
        if (p["single"].size() > 1 && last.contains("SpecialToken")) {
          const std::string tok = last["SpecialToken"].value("id", "");
          for (size_t i = 0; i < s.tokens.size(); ++i)
            if (s.tokens[i] == tok) s.suffix_id = static_cast<int32_t>(i);
          FP_CHECK(s.suffix_id >= 0, path, ": post_processor appends '", tok, "', which is not in the vocabulary");
        }
      }
    };
    read_post(j.value("post_processor", json()));
  } catch (const json::exception& e) {
    fail(path, ": unexpected JSON structure: ", e.what());
  }

  // tokenizer_config.json beside it: bos/eos tokens and whether BOS/EOS are added.
  const std::filesystem::path cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    const json cfg = parse_json_file(cfg_path.string());
    auto id_of = [&](const std::string& text, const char* key) -> int32_t {
      if (text.empty()) return -1;
      for (size_t i = 0; i < s.tokens.size(); ++i)
        if (s.tokens[i] == text) return static_cast<int32_t>(i);
      log_warn(cfg_path.string(), ": ", key, " '", text, "' is not in the vocabulary");
      return -1;
    };
    try {
      if (cfg.contains("bos_token")) s.bos_id = id_of(config_token(cfg, "bos_token"), "bos_token");
      if (cfg.contains("eos_token")) s.eos_id = id_of(config_token(cfg, "eos_token"), "eos_token");
      if (cfg.contains("pad_token")) s.pad_id = id_of(config_token(cfg, "pad_token"), "pad_token");
      // Without add_bos_token a configured BOS is added (Llama-3's convention).
      s.add_bos = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean() ? cfg["add_bos_token"].get<bool>()
                                                                                      : (s.bos_id >= 0 || s.add_bos);
      if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) s.add_eos = cfg["add_eos_token"].get<bool>();
    } catch (const json::exception& e) {
      fail(cfg_path.string(), ": unexpected JSON structure: ", e.what());
    }
  }
  return Tokenizer::from_spec(std::move(s));
}
}  // namespace

}  // namespace fp

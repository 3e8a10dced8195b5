// tokenizer/chat_template.h — chat prompts rendered with a model's own Jinja chat template, the
// way Hugging Face transformers' apply_chat_template renders them.
//
// Variables a template sees: `messages` (the conversation as given), `add_generation_prompt`,
// `tools` (none unless given in extra_vars), `documents` (none), the special tokens of the
// tokenizer (bos_token, eos_token, pad_token, unk_token, ... as transformers' special_tokens_map:
// only those that are set), then every entry of `extra_vars` (e.g. "enable_thinking": false).
//
// Where the template comes from (ChatTemplate::from_path):
//   - a directory: chat_template.jinja, else chat_template.json, else tokenizer_config.json in it;
//   - a tokenizer_config.json (or tokenizer.json: the tokenizer_config.json beside it): the field
//     `chat_template`, a string or a list of {"name", "template"} (the one named "default");
//   - a .gguf file: the metadata key `tokenizer.chat_template`, with bos/eos from
//     tokenizer.ggml.bos_token_id / eos_token_id.
//
// Plain fallback, for models without a template: one line per message,
//     "<role>: <content>\n"
// then "assistant: " when add_generation_prompt is set. Content that is a list of parts
// ({"type": "text", "text": ...}) contributes its texts; null content is empty.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp {

class GgufFile;
namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role, content;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // other fields: tool_calls, reasoning_content, ...
};

// [{"role": ..., "content": ..., <extra fields>}, ...]
nlohmann::ordered_json to_json(const std::vector<ChatMessage>& messages);

// Renders `template_src` once (parsing it each call); empty bos/eos tokens are left undefined.
// Throws fp::Error (naming line and column) on a template error or raise_exception().
std::string render_chat(const std::string& template_src, const nlohmann::ordered_json& messages,
                        bool add_generation_prompt, const std::string& bos_token, const std::string& eos_token,
                        const nlohmann::ordered_json& extra_vars = nlohmann::ordered_json::object());

// The documented fallback for models without a template.
std::string render_plain_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt);
// A message's content as text: a string, or its parts' texts joined (null: empty).
std::string chat_content_text(const nlohmann::ordered_json& content);

// A parsed chat template with the special tokens that go with it; parse once, render many.
class ChatTemplate {
 public:
  // An empty `source` selects the plain fallback. `special_tokens`: {"bos_token": "<s>", ...}.
  ChatTemplate(std::string source, nlohmann::ordered_json special_tokens, std::string origin);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `name` picks one of several named templates.
  static ChatTemplate from_tokenizer_config(const std::string& path, const std::string& name = "default");
  static ChatTemplate from_gguf(const GgufFile& gguf);
  // A directory, a tokenizer_config.json / tokenizer.json path, or a .gguf file (see the header
  // comment). Finding no template is not an error: the result is the fallback.
  static ChatTemplate from_path(const std::string& path);

  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra_vars = nlohmann::ordered_json::object()) const;

  bool is_fallback() const { return compiled_ == nullptr; }
  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }  // file (and field) it came from
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  std::string source_, origin_;
  nlohmann::ordered_json special_tokens_;
  std::unique_ptr<jinja::Template> compiled_;
};

}  // namespace fp

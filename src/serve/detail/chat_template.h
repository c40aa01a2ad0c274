#pragma once

// How `cohort serve` turns the messages of POST /v1/chat/completions into
// one prompt (docs/deploy.md, "The OpenAI API"). No Jinja engine runs here:
// a model's tokenizer_config.json "chat_template" is recognised by its
// markers, and only ChatML (<|im_start|>role\ncontent<|im_end|>\n, the
// template of Qwen, SmolLM and many fine-tunes) is understood; without a
// template, or with one that is not ChatML, the documented default is used:
//
//   <|system|>\nYou are terse.\n<|user|>\nHello\n<|assistant|>\n

#include <string>
#include <vector>

namespace cohort::serve::detail {

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kDefault, kChatML };

  explicit ChatTemplate(Kind kind = Kind::kDefault) : kind_(kind) {}

  // The template of the model at `modelPath` (a directory, or a file whose
  // directory is read): its tokenizer_config.json's "chat_template" (a
  // string, or a list of {"name", "template"} of which "default" or the
  // first is taken) when present. `note` says what was found and chosen,
  // for the start-up log. Throws DataError when tokenizer_config.json is
  // there but not JSON.
  static ChatTemplate forModel(const std::string& modelPath, std::string* note = nullptr);
  // A chat_template's text: ChatML when it holds <|im_start|> and
  // <|im_end|>, else the default (`understood` false).
  static ChatTemplate fromTemplateText(const std::string& text, bool* understood = nullptr);

  Kind kind() const { return kind_; }
  const char* name() const { return kind_ == Kind::kChatML ? "chatml" : "default"; }

  // The prompt: each message in the template's turn format, then the
  // assistant's turn opened for the model to complete.
  std::string render(const std::vector<ChatMessage>& messages) const;

  // Where the assistant's turn ends: the text is cut there, as at a
  // request's stop strings ("<|im_end|>" for ChatML; "\n<|" for the
  // default, the next turn's marker).
  std::vector<std::string> stops() const;

 private:
  Kind kind_;
};

}  // namespace cohort::serve::detail

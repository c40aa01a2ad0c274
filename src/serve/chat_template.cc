#include "serve/detail/chat_template.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/core/error.h"

namespace cohort::serve::detail {

namespace fs = std::filesystem;
using nlohmann::json;

ChatTemplate ChatTemplate::fromTemplateText(const std::string& text, bool* understood) {
  const bool chatml = text.find("<|im_start|>") != std::string::npos && text.find("<|im_end|>") != std::string::npos;
  if (understood) *understood = chatml;
  return ChatTemplate(chatml ? Kind::kChatML : Kind::kDefault);
}

ChatTemplate ChatTemplate::forModel(const std::string& modelPath, std::string* note) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(modelPath, ec) ? fs::path(modelPath) : fs::path(modelPath).parent_path();
  const fs::path config = dir / "tokenizer_config.json";
  auto say = [&](const std::string& what) {
    if (note) *note = what;
  };
  if (!fs::is_regular_file(config, ec)) {
    say("the default chat template (no tokenizer_config.json beside the model)");
    return ChatTemplate();
  }
  std::ifstream in(config);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw DataError(fmt::format("{}: not a JSON object", config.string()));
  }
  std::string chosen;
  if (j.contains("chat_template")) {
    const json& t = j["chat_template"];
    if (t.is_string()) {
      chosen = t.get<std::string>();
    } else if (t.is_array()) {
      // Hugging Face's named templates: "default", else the first.
      for (const json& named : t) {
        if (!named.is_object() || !named.contains("template") || !named["template"].is_string()) continue;
        const bool isDefault = named.value("name", "") == "default";
        if (chosen.empty() || isDefault) chosen = named["template"].get<std::string>();
        if (isDefault) break;
      }
    }
  }
  if (chosen.empty()) {
    say(fmt::format("the default chat template ({} has no chat_template)", config.string()));
    return ChatTemplate();
  }
  bool understood = false;
  ChatTemplate t = fromTemplateText(chosen, &understood);
  say(understood ? fmt::format("the ChatML chat template of {}", config.string())
                 : fmt::format("the default chat template: the chat_template of {} is not ChatML, the only "
                               "kind cohort reads (no Jinja engine)",
                               config.string()));
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  std::string prompt;
  if (kind_ == Kind::kChatML) {
    for (const ChatMessage& m : messages) prompt += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    return prompt + "<|im_start|>assistant\n";
  }
  for (const ChatMessage& m : messages) prompt += "<|" + m.role + "|>\n" + m.content + "\n";
  return prompt + "<|assistant|>\n";
}

std::vector<std::string> ChatTemplate::stops() const {
  if (kind_ == Kind::kChatML) return {"<|im_end|>"};
  return {"\n<|"};
}

}  // namespace cohort::serve::detail

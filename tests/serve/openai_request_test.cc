// The OpenAI routes' request parsing (openai_request.h) and chat templates
// (chat_template.h), in-process: every bad input of the issue is an
// OpenAIError with a 4xx status, the field at fault and OpenAI's code, and
// its body is OpenAI's error object; good bodies become the generations
// they ask for.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "serve/detail/chat_template.h"
#include "serve/detail/openai_request.h"
#include "util/process.h"
#include "util/serve_info.h"

namespace cohort::serve::detail::openai_request_test {
namespace {

using nlohmann::json;

// A byte-level language model: vocabulary 256, block `block`.
ModelInfo gptInfo(int64_t block = 16) {
  ModelInfo m;
  m.arch = "gpt";
  m.tokens = true;
  m.tokenizer = "bytes";
  m.vocabSize = 256;
  m.tokenizerVocab = 256;
  m.blockSize = block;
  return m;
}

OpenAILimits limits() { return {"tiny", 64}; }

OpenAIRequest completion(const json& body) { return parseCompletion(body.dump(), gptInfo(), limits(), 7); }
OpenAIRequest chat(const json& body) { return parseChat(body.dump(), gptInfo(64), limits(), ChatTemplate(), 7); }

struct Refusal {
  int status = 0;
  std::string param, code, message;
};

template <class F>
Refusal refusalOf(F parse) {
  try {
    parse();
  } catch (const OpenAIError& e) {
    return {e.status, e.param, e.code, e.what()};
  }
  ADD_FAILURE() << "accepted";
  return {};
}

TEST(OpenAIRequest, ACompletionBecomesItsGeneration) {
  const OpenAIRequest r = completion({{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 5}, {"temperature", 0},
                                      {"top_p", 0.5}, {"n", 3}, {"stop", "\n"}, {"seed", 11}, {"logprobs", 2},
                                      {"stream", true}, {"stream_options", {{"include_usage", true}}},
                                      {"user", "u"}, {"echo", false}, {"presence_penalty", 0}});
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.model, "tiny");
  EXPECT_EQ(r.generate.prompt, (std::vector<int64_t>{'a', 'b', 'c'}));
  EXPECT_EQ(r.generate.maxTokens, 5);
  EXPECT_EQ(r.generate.sampling.temperature, 0);
  EXPECT_EQ(r.generate.sampling.topP, 0.5);
  EXPECT_EQ(r.generate.sampling.seed, 11u);
  EXPECT_EQ(r.generate.stops, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.generate.logprobs, 2);
  EXPECT_TRUE(r.generate.stream);
  EXPECT_TRUE(r.includeUsage);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.promptBytes, 3u);

  // Defaults: 16 tokens, the given seed, no logprobs; a list of one prompt, or token ids.
  const OpenAIRequest d = completion({{"model", "tiny"}, {"prompt", {"hi"}}, {"max_tokens", nullptr}});
  EXPECT_EQ(d.generate.maxTokens, 16);
  EXPECT_EQ(d.generate.sampling.seed, 7u);
  EXPECT_EQ(d.generate.logprobs, -1);
  EXPECT_EQ(d.n, 1);
  EXPECT_EQ(completion({{"model", "tiny"}, {"prompt", {104, 105}}}).generate.prompt, d.generate.prompt);
}

TEST(OpenAIRequest, AChatBecomesItsTemplatedPrompt) {
  const OpenAIRequest r =
      chat({{"model", "tiny"},
            {"messages", {{{"role", "system"}, {"content", "S"}},
                          {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "hi"}}})}}}},
            {"logprobs", true}, {"top_logprobs", 3}, {"max_completion_tokens", 4}});
  EXPECT_TRUE(r.chat);
  const std::string prompt = "<|system|>\nS\n<|user|>\nhi\n<|assistant|>\n";
  EXPECT_EQ(r.generate.prompt, std::vector<int64_t>(prompt.begin(), prompt.end()));
  EXPECT_EQ(r.promptBytes, prompt.size());
  EXPECT_EQ(r.generate.logprobs, 3);
  EXPECT_EQ(r.generate.maxTokens, 4);
  EXPECT_EQ(r.generate.stops, std::vector<std::string>{"\n<|"});
}

TEST(OpenAIRequest, ChatTemplates) {
  const std::vector<ChatMessage> m{{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(ChatTemplate().render(m), "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
  const ChatTemplate chatml(ChatTemplate::Kind::kChatML);
  EXPECT_EQ(chatml.render(m), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                              "<|im_start|>assistant\n");
  EXPECT_EQ(chatml.stops(), std::vector<std::string>{"<|im_end|>"});

  // tokenizer_config.json beside the model: ChatML is recognised by its
  // markers; any other template falls back to the default, said so.
  test::TempDir dir;
  std::string note;
  EXPECT_EQ(ChatTemplate::forModel(dir.path(), &note).kind(), ChatTemplate::Kind::kDefault);
  EXPECT_NE(note.find("no tokenizer_config.json"), std::string::npos) << note;
  const std::string qwen =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  test::writeText(dir.file("tokenizer_config.json"), json{{"chat_template", qwen}}.dump());
  EXPECT_EQ(ChatTemplate::forModel(dir.path(), &note).kind(), ChatTemplate::Kind::kChatML);
  EXPECT_EQ(ChatTemplate::forModel(dir.file("model.pt"), &note).kind(), ChatTemplate::Kind::kChatML);
  test::writeText(dir.file("tokenizer_config.json"),
                  json{{"chat_template", json::array({{{"name", "tool_use"}, {"template", "x"}},
                                                      {{"name", "default"}, {"template", qwen}}})}}
                      .dump());
  EXPECT_EQ(ChatTemplate::forModel(dir.path(), &note).kind(), ChatTemplate::Kind::kChatML);
  test::writeText(dir.file("tokenizer_config.json"), json{{"chat_template", "{{ bos_token }}[INST]"}}.dump());
  EXPECT_EQ(ChatTemplate::forModel(dir.path(), &note).kind(), ChatTemplate::Kind::kDefault);
  EXPECT_NE(note.find("not ChatML"), std::string::npos) << note;
  test::writeText(dir.file("tokenizer_config.json"), "{not json");
  EXPECT_THROW(ChatTemplate::forModel(dir.path()), DataError);
}

// Each bad input of the issue: its status, the field named, OpenAI's code.
TEST(OpenAIRequest, BadInputIsA4xxNamingTheField) {
  const json ok{{"model", "tiny"}, {"prompt", "abc"}};
  auto with = [&](const char* key, const json& value) {
    json j = ok;
    j[key] = value;
    return j;
  };
  struct Case {
    json body;
    int status;
    std::string param, code;
  };
  const std::vector<Case> cases{
      {with("max_tokens", "ten"), 400, "max_tokens", ""},
      {with("temperature", "hot"), 400, "temperature", ""},
      {with("temperature", 2.5), 400, "temperature", ""},
      {with("n", 1.5), 400, "n", ""},
      {with("stream", "yes"), 400, "stream", ""},
      {with("stop", 3), 400, "stop", ""},
      {with("stop", json::array({""})), 400, "stop", ""},
      {with("seed", "1"), 400, "seed", ""},
      {with("prompt", 3), 400, "prompt", ""},
      {with("prompt", json::array({"a", "b"})), 400, "prompt", ""},
      {with("model", 3), 400, "model", ""},
      {with("n", kMaxChoices + 1), 400, "n", ""},
      {with("n", 0), 400, "n", ""},
      {with("max_tokens", -1), 400, "max_tokens", ""},
      {with("max_tokens", 65), 400, "max_tokens", ""},
      {with("max_tokens", json::parse("18446744073709551615")), 400, "max_tokens", ""},
      {with("max_tokens", 1e300), 400, "max_tokens", ""},
      {with("logprobs", 6), 400, "logprobs", ""},
      {with("echo", true), 400, "echo", ""},
      {with("frequency_penalty", 0.5), 400, "frequency_penalty", ""},
      {with("tools", json::array()), 400, "tools", ""},
      {with("stream_options", {{"include_usage", true}}), 400, "stream_options", ""},
      {with("model", "gpt-4o"), 404, "model", "model_not_found"},
      {with("prompt", std::string(17, 'x')), 400, "prompt", "context_length_exceeded"},
      {with("prompt", json::array({300})), 400, "prompt", ""},
      {json{{"prompt", "abc"}}, 400, "model", ""},
      {json{{"model", "tiny"}}, 400, "prompt", ""},
  };
  for (const Case& c : cases) {
    const Refusal r = refusalOf([&] { completion(c.body); });
    EXPECT_EQ(r.status, c.status) << c.body.dump() << ": " << r.message;
    EXPECT_EQ(r.param, c.param) << c.body.dump() << ": " << r.message;
    EXPECT_EQ(r.code, c.code) << c.body.dump() << ": " << r.message;
  }
  for (const std::string body : {"{not json", "[1, 2]", "\"text\""}) {
    const Refusal r = refusalOf([&] { parseCompletion(body, gptInfo(), limits(), 0); });
    EXPECT_EQ(r.status, 400) << body;
  }
  // An image model has no completions.
  EXPECT_EQ(refusalOf([&] { parseCompletion(ok.dump(), test::imageModelInfo(1, 2, 2, 3), limits(), 0); }).status,
            400);
}

TEST(OpenAIRequest, BadChatMessagesAre400NamingTheMessage) {
  const json user{{"role", "user"}, {"content", "hi"}};
  struct Case {
    json messages;
    std::string param;
  };
  const std::vector<Case> cases{
      {json::array({user, {{"role", "user"}}}), "messages.[1].content"},
      {json::array({{{"role", "user"}, {"content", nullptr}}}), "messages.[0].content"},
      {json::array({{{"role", "user"}, {"content", 5}}}), "messages.[0].content"},
      {json::array({{{"role", "user"}, {"content", json::array()}}}), "messages.[0].content"},
      {json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}}), "messages.[0].content"},
      {json::array({{{"role", "tool"}, {"content", "x"}}}), "messages.[0].role"},
      {json::array({{{"content", "x"}}}), "messages.[0].role"},
      {json::array({"hi"}), "messages.[0]"},
      {json::array(), "messages"},
      {json("hi"), "messages"},
      {json::array({{{"role", "user"}, {"content", std::string(60, 'x')}}}), "messages"},
  };
  for (const Case& c : cases) {
    const Refusal r = refusalOf([&] { chat({{"model", "tiny"}, {"messages", c.messages}}); });
    EXPECT_EQ(r.status, 400) << c.messages.dump();
    EXPECT_EQ(r.param, c.param) << c.messages.dump() << ": " << r.message;
  }
  EXPECT_EQ(refusalOf([&] { chat({{"model", "tiny"}, {"messages", {user}}, {"top_logprobs", 2}}); }).param,
            "top_logprobs");
  EXPECT_EQ(refusalOf([&] {
              chat({{"model", "tiny"}, {"messages", {user}}, {"logprobs", true}, {"top_logprobs", 21}});
            }).param,
            "top_logprobs");
}

TEST(OpenAIRequest, ErrorsAreOpenAIsErrorObject) {
  const json e = json::parse(openAIErrorBody(404, "no such model", "model", "model_not_found"));
  EXPECT_EQ(e, (json{{"error",
                      {{"message", "no such model"}, {"type", "invalid_request_error"}, {"param", "model"},
                       {"code", "model_not_found"}}}}));
  const json plain = json::parse(openAIErrorBody(500, "boom"));
  EXPECT_EQ(plain["error"]["type"], "server_error");
  EXPECT_TRUE(plain["error"]["param"].is_null());
  EXPECT_TRUE(plain["error"]["code"].is_null());
  EXPECT_EQ(openAIErrorType(401), "authentication_error");
  EXPECT_EQ(openAIErrorType(429), "rate_limit_error");
  EXPECT_EQ(openAIErrorType(413), "invalid_request_error");
}

}  // namespace
}  // namespace cohort::serve::detail::openai_request_test

// Every cohort command line that README.md and docs/*.md print is one the
// command line accepts: each is parsed by `cohort` itself, nothing run
// (COHORT_PARSE_ONLY, core/env.h). Lines in code blocks must parse whole;
// a command quoted in a sentence may leave out required arguments
// (`cohort run --procs`), but every option and subcommand it names must
// exist. Synopses are expanded: each `a|b` alternative, optional `[...]`
// parts left out and put in, placeholder values (`--procs N`) given one.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "util/jobs.h"
#include "util/process.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

struct Quoted {
  std::string where;    // file:line
  std::string command;  // as printed, from `cohort` on
  bool whole;           // in a code block: must parse whole
};

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// `cohort` or a path ending in /cohort, then a command word (not output
// such as "cohort plan: ...").
const std::regex kCommand(R"(^(\S*/)?cohort\s+[a-z][a-z-]*(\s.*)?$)");

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The commands one Markdown file prints: whole lines of code blocks, and
// code spans of its paragraphs (which may wrap).
std::vector<Quoted> quotedIn(const std::string& path, const std::string& name) {
  std::vector<Quoted> out;
  const auto text = lines(path);
  bool fence = false;
  std::string paragraph;
  size_t paragraphLine = 0;
  auto spans = [&] {
    for (size_t at = 0;;) {
      const size_t open = paragraph.find('`', at);
      if (open == std::string::npos) break;
      const size_t close = paragraph.find('`', open + 1);
      if (close == std::string::npos) break;
      const std::string span = trim(paragraph.substr(open + 1, close - open - 1));
      if (std::regex_match(span, kCommand)) {
        out.push_back({name + ":" + std::to_string(paragraphLine), span, false});
      }
      at = close + 1;
    }
    paragraph.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const std::string t = trim(text[i]);
    if (t.rfind("```", 0) == 0) {
      spans();
      fence = !fence;
      continue;
    }
    if (fence) {
      if (!std::regex_match(t, kCommand)) continue;
      std::string command = t;
      const size_t first = i;
      while (!command.empty() && command.back() == '\\' && i + 1 < text.size()) {
        command.pop_back();
        command += " " + trim(text[++i]);
      }
      out.push_back({name + ":" + std::to_string(first + 1), command, true});
      continue;
    }
    if (t.empty()) {
      spans();
      continue;
    }
    if (paragraph.empty()) paragraphLine = i + 1;
    paragraph += " " + t;
  }
  spans();
  return out;
}

// Shell words of `s` (quotes kept out, a comment dropped).
std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  bool any = false;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
      else w += c;
    } else if (c == '"' || c == '\'') {
      quote = c;
      any = true;
    } else if (c == ' ' || c == '\t') {
      if (any || !w.empty()) out.push_back(w);
      w.clear();
      any = false;
    } else if (c == '#' && w.empty() && !any) {
      break;
    } else {
      w += c;
    }
  }
  if (any || !w.empty()) out.push_back(w);
  return out;
}

// Optional parts: `with` keeps what the brackets hold (the first of its
// ` | ` choices), otherwise each outermost [...] goes.
std::string optionals(const std::string& s, bool with) {
  std::string out;
  int depth = 0;
  std::string group;
  for (const char c : s) {
    if (c == '[') {
      if (depth++ > 0) group += c;
      continue;
    }
    if (c == ']' && depth > 0) {
      if (--depth > 0) {
        group += c;
        continue;
      }
      if (with) {
        const std::string first = group.substr(0, group.find(" | "));
        out += optionals(first, true);
      }
      group.clear();
      continue;
    }
    (depth > 0 ? group : out) += c;
  }
  return out;
}

// A value for a placeholder after an option (N, P, r, F, ...).
std::string valueFor(const std::string& option, const std::string& placeholder) {
  static const std::regex kPlaceholder(R"(^([A-Z]{1,4}|[a-z])$)");
  if (!std::regex_match(placeholder, kPlaceholder)) return placeholder;
  if (option == "--format") return "onnx";
  return "1";
}

// The argument lists one printed command stands for.
std::vector<std::vector<std::string>> variants(const std::string& printed) {
  std::string s = std::regex_replace(printed, std::regex(R"(\\\|)"), "|");
  std::vector<std::vector<std::string>> out;
  for (const bool with : {false, true}) {
    std::vector<std::vector<std::string>> argvs{{}};
    const auto ws = words(optionals(s, with));
    for (size_t k = 1; k < ws.size(); ++k) {  // ws[0]: cohort
      const std::string& w = ws[k];
      if (w.empty()) continue;
      // `--set ...`: some value; a lone `...`: more of the same, none needed.
      if (w == "...") {
        if (argvs.front().empty() || argvs.front().back().rfind("--", 0) != 0) continue;
        for (auto& a : argvs) a.push_back("1");
        continue;
      }
      std::vector<std::string> choices;
      if (w.find('|') != std::string::npos && w.rfind("--", 0) != 0) {
        for (size_t a = 0, b; a <= w.size(); a = b + 1) {
          b = w.find('|', a);
          if (b == std::string::npos) b = w.size();
          if (b > a) choices.push_back(w.substr(a, b - a));
        }
      } else {
        choices.push_back(w);
      }
      std::vector<std::vector<std::string>> next;
      for (const auto& argv : argvs) {
        for (const auto& c : choices) {
          auto a = argv;
          a.push_back(!a.empty() && a.back().rfind("--", 0) == 0 ? valueFor(a.back(), c) : c);
          next.push_back(std::move(a));
          if (next.size() >= 16) break;
        }
      }
      argvs = std::move(next);
    }
    for (auto& a : argvs) {
      if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
    }
  }
  return out;
}

TEST(DocsCommands, EveryCommandLineTheDocsPrintParses) {
  std::vector<Quoted> quoted = quotedIn(test::sourceDir() + "/README.md", "README.md");
  for (const auto& e : fs::directory_iterator(test::sourceDir() + "/docs")) {
    if (e.path().extension() != ".md") continue;
    auto more = quotedIn(e.path().string(), "docs/" + e.path().filename().string());
    quoted.insert(quoted.end(), more.begin(), more.end());
  }
  // The extraction finds what it should: these are printed today.
  ASSERT_GT(quoted.size(), 150u);
  std::set<std::vector<std::string>> done;
  std::string failures;
  int runs = 0;
  for (const Quoted& q : quoted) {
    for (const auto& argv : variants(q.command)) {
      if (!done.insert(argv).second) continue;
      std::vector<std::string> full{test::cohortBin()};
      full.insert(full.end(), argv.begin(), argv.end());
      const std::map<std::string, std::string> only{{"COHORT_PARSE_ONLY", q.whole ? "full" : "partial"}};
      auto r = test::run(full, only, std::chrono::seconds(60));
      ++runs;
      // A sentence that names an option (`cohort run --procs`) without its
      // value: the option with one.
      if (r.exitCode != 0 && !q.whole && full.back().rfind("--", 0) == 0 &&
          r.err.find("required") != std::string::npos) {
        full.push_back(valueFor(full.back(), "N"));
        r = test::run(full, only, std::chrono::seconds(60));
      }
      if (r.exitCode == 0 && r.out.find("cohort: parsed") != std::string::npos) continue;
      std::string line;
      for (const auto& a : argv) line += " " + a;
      failures += q.where + ": `" + q.command + "`\n  as: cohort" + line + "\n  " + r.err + r.out + "\n";
    }
  }
  EXPECT_TRUE(failures.empty()) << failures;
  RecordProperty("command_lines_parsed", runs);
}

// The check can fail: an option the CLI does not have, a missing argument
// in a code block, a command that does not exist.
TEST(DocsCommands, TheParseOnlyModeRefusesWhatTheCliRefuses) {
  const auto parse = [](std::vector<std::string> argv, const char* mode) {
    argv.insert(argv.begin(), test::cohortBin());
    return test::run(argv, {{"COHORT_PARSE_ONLY", mode}}, std::chrono::seconds(60));
  };
  EXPECT_EQ(parse({"ckpt", "consolidate", "step-3", "--out", "m.pt"}, "full").exitCode, 0);
  EXPECT_EQ(parse({"run", "--procs", "2"}, "partial").exitCode, 0);
  const auto extra = parse({"ckpt", "verify", "step-3", "--out", "m.pt"}, "full");
  EXPECT_EQ(extra.exitCode, 2) << extra.describe();
  EXPECT_NE(extra.err.find("--out"), std::string::npos) << extra.describe();
  EXPECT_EQ(parse({"run", "--procs", "2"}, "full").exitCode, 2);
  EXPECT_EQ(parse({"run", "--no-such-option"}, "partial").exitCode, 2);
  EXPECT_EQ(parse({"trian", "job.yaml"}, "partial").exitCode, 2);
  EXPECT_EQ(parse({"serve", "RUN", "--port", "x"}, "partial").exitCode, 2);  // through cohort-torch
  // Nothing ran: no run directory, no output.
  const auto job = parse({"run", "no-such-job.yaml"}, "full");
  EXPECT_EQ(job.exitCode, 0) << job.describe();
}

// The expansion of a synopsis.
TEST(DocsCommands, SynopsesExpandToEachAlternativeWithAndWithoutOptionalParts) {
  const auto v = variants("cohort ckpt list|verify PATH [--procs N] # comment");
  const std::vector<std::vector<std::string>> want{{"ckpt", "list", "PATH"},
                                                   {"ckpt", "verify", "PATH"},
                                                   {"ckpt", "list", "PATH", "--procs", "1"},
                                                   {"ckpt", "verify", "PATH", "--procs", "1"}};
  EXPECT_EQ(v, want);
  EXPECT_EQ(variants("cohort generate RUN --prompt \"And God said\"").front(),
            (std::vector<std::string>{"generate", "RUN", "--prompt", "And God said"}));
  const auto quoted = quotedIn(test::sourceDir() + "/docs/parallelism.md", "docs/parallelism.md");
  bool consolidate = false;
  for (const auto& q : quoted) consolidate = consolidate || q.command.find("ckpt consolidate") != std::string::npos;
  EXPECT_TRUE(consolidate) << "a command wrapped across two lines of a paragraph was not found";
}

}  // namespace
}  // namespace cohort

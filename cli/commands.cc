#include "commands.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/launch/spawn.h"
#include "common.h"

namespace cohort::cli {

namespace {

template <size_t N>
const EngineCommand* findIn(const EngineCommand (&commands)[N], const std::string& name) {
  for (const EngineCommand& c : commands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

}  // namespace

const char* engineCommandDescription(const std::string& name, bool ckpt) {
  const EngineCommand* c = ckpt ? findIn(kEngineCkptCommands, name) : findIn(kEngineCommands, name);
  if (c == nullptr) throw Error("no engine command '" + name + "'");
  return c->description;
}

bool needsEngine(int argc, char** argv) {
  // The command is the first argument: cohort takes no option before it
  // but --help and --version, which the front end answers.
  if (argc < 2) return false;
  const std::string command = argv[1];
  const std::string next = argc > 2 ? argv[2] : "";
  if (findIn(kEngineCommands, command) != nullptr) return true;
  if (command == "ckpt") return findIn(kEngineCkptCommands, next) != nullptr;
  if (command == "help") return findIn(kEngineCommands, next) != nullptr;
  return false;
}

void addEngineStubs(CLI::App& app, CLI::App* ckpt) {
  for (const EngineCommand& c : kEngineCommands) app.add_subcommand(c.name, c.description)->allow_extras();
  for (const EngineCommand& c : kEngineCkptCommands) ckpt->add_subcommand(c.name, c.description)->allow_extras();
}

int execEngine(int argc, char** argv) {
  std::string engine;
  try {
    const std::string self = launch::selfExecutable();
    engine = self.substr(0, self.rfind('/') + 1) + launch::kEngineProgram;
  } catch (...) {
    return reportCurrentException();
  }
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  execv(engine.c_str(), args.data());
  return fail("cannot run " + engine + ", which runs `cohort " + argv[1] + "`: " + std::strerror(errno) +
                  " (it is built and installed beside cohort)",
              127);
}

}  // namespace cohort::cli

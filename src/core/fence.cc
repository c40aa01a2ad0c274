#include "cohort/core/fence.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "cohort/core/exit_codes.h"
#include "cohort/core/file.h"
#include "cohort/core/log.h"

namespace cohort::fence {
namespace {

namespace fs = std::filesystem;

std::string fencedDir(const std::string& runRoot) { return runRoot + "/fenced"; }

struct Installed {
  std::mutex mutex;
  std::string runRoot, node;
  int64_t round = -1;
};

Installed& installed() {
  static Installed* i = new Installed;  // never destroyed: asked from any thread until exit
  return *i;
}

}  // namespace

void markLost(const std::string& runRoot, const std::string& node, int64_t round) {
  const std::string path = fmt::format("{}/{}-{}", fencedDir(runRoot), round, node);
  std::error_code ec;
  if (!fs::exists(path, ec)) writeFileAtomic(path, "");
}

int64_t lostIn(const std::string& runRoot, const std::string& node) {
  int64_t latest = -1;
  std::error_code ec;
  for (fs::directory_iterator it(fencedDir(runRoot), ec), end; !ec && it != end; it.increment(ec)) {
    // "<round>-<node>"; node ids may hold '-' themselves.
    const std::string name = it->path().filename().string();
    const size_t dash = name.find('-');
    if (dash == 0 || dash == std::string::npos || dash > 18 || name.compare(dash + 1, std::string::npos, node) != 0) {
      continue;
    }
    if (name.find_first_not_of("0123456789") != dash) continue;
    latest = std::max<int64_t>(latest, std::stoll(name.substr(0, dash)));
  }
  return latest;
}

void install(const std::string& runRoot, const std::string& node, int64_t round) {
  Installed& i = installed();
  std::lock_guard<std::mutex> g(i.mutex);
  i.runRoot = runRoot;
  i.node = node;
  i.round = round;
}

namespace {

// The round this process's node was marked lost in, when at or after its
// own; -1 otherwise.
int64_t fencedIn(std::string& root, int64_t& mine) {
  Installed& i = installed();
  std::string node;
  {
    std::lock_guard<std::mutex> g(i.mutex);
    root = i.runRoot;
    node = i.node;
    mine = i.round;
  }
  if (root.empty()) return -1;
  const int64_t lost = lostIn(root, node);
  return lost >= mine ? lost : -1;
}

}  // namespace

bool fenced() {
  std::string root;
  int64_t mine = -1;
  return fencedIn(root, mine) >= 0;
}

void check(const std::string& what) {
  std::string root;
  int64_t mine = -1;
  const int64_t lost = fencedIn(root, mine);
  if (lost < 0) return;
  log::error("fenced: the other nodes declared this node lost in round {} (cut off or stopped for "
             "longer than elastic.node_timeout_s) and went on without it; this rank of round {} "
             "does not write {} into {}, and stops",
             lost, mine, what, root);
  log::flush();
  std::_Exit(kExitFenced);
}

}  // namespace cohort::fence

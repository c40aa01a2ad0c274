#include "cohort/core/error.h"

#include <cstdio>
#include <cstdlib>

#include "cohort/core/log.h"

namespace cohort::detail {

void assertFail(const char* file, int line, const char* cond,
                const std::string& msg) {
  std::string text = concat("internal error at ", file, ":", line,
                            ": assertion '", cond, "' failed",
                            msg.empty() ? "" : ": ", msg);
  log::critical("{}", text);
  log::flush();
  std::fprintf(stderr, "%s\n", text.c_str());
  std::abort();
}

}  // namespace cohort::detail

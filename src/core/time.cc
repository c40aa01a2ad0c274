#include "cohort/core/time.h"

namespace cohort {

std::string formatUtc(std::time_t t, const char* format) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof buf, format, &tm);
  return std::string(buf, n);
}

std::string utcNow() { return formatUtc(std::time(nullptr), "%Y-%m-%dT%H:%M:%SZ"); }

}  // namespace cohort

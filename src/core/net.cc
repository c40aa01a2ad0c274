#include "cohort/core/net.h"

#include <unistd.h>

namespace cohort {

bool isLoopbackAddress(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "unknown";
  return host;
}

}  // namespace cohort

#include "cohort/core/net.h"

namespace cohort {

bool isLoopbackAddress(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

}  // namespace cohort

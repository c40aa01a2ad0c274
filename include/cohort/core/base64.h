#pragma once

// Base64 (RFC 4648, with padding): Azure's signatures and block ids, etcd's
// keys and values in its JSON API.

#include <string>

namespace cohort {

std::string base64Encode(const std::string& bytes);
// Throws std::invalid_argument when `text` is not base64.
std::string base64Decode(const std::string& text);

}  // namespace cohort

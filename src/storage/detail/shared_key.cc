#include "storage/detail/shared_key.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <stdexcept>

#include "cohort/core/text.h"

namespace cohort::storage::detail {
namespace {

// Header values are signed trimmed, with runs of whitespace folded to one space.
std::string canonicalValue(const std::string& v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      space = !out.empty();
    } else {
      if (space) out += ' ';
      space = false;
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string hmacSha256(const std::string& key, const std::string& message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest,
           &length) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<const char*>(digest), length);
}

std::string percentEncode(const std::string& s, bool keepSlash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keepSlash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string percentDecode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string encodeQuery(const Query& query) {
  std::string out;
  for (const auto& [name, value] : query) {
    if (!out.empty()) out += '&';
    out += percentEncode(name) + "=" + percentEncode(value);
  }
  return out;
}

std::string httpDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  static const char* days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday],
                tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return buf;
}

std::string sharedKeyStringToSign(const std::string& account, const std::string& method,
                                  const std::string& encodedPath, const Query& query,
                                  const Headers& headers, int64_t contentLength) {
  std::map<std::string, std::string> standard, msHeaders;
  for (const auto& [name, value] : headers) {
    const std::string n = lowerAscii(name);
    (n.rfind("x-ms-", 0) == 0 ? msHeaders : standard)[n] = canonicalValue(value);
  }
  auto get = [&](const char* name) {
    auto it = standard.find(name);
    return it == standard.end() ? std::string() : it->second;
  };
  std::string s = method + "\n";
  s += get("content-encoding") + "\n";
  s += get("content-language") + "\n";
  s += (contentLength > 0 ? std::to_string(contentLength) : std::string()) + "\n";
  s += get("content-md5") + "\n";
  s += get("content-type") + "\n";
  s += get("date") + "\n";
  s += get("if-modified-since") + "\n";
  s += get("if-match") + "\n";
  s += get("if-none-match") + "\n";
  s += get("if-unmodified-since") + "\n";
  s += get("range") + "\n";
  for (const auto& [name, value] : msHeaders) s += name + ":" + value + "\n";
  s += "/" + account + encodedPath;
  std::map<std::string, std::vector<std::string>> params;
  for (const auto& [name, value] : query) params[lowerAscii(name)].push_back(value);
  for (auto& [name, values] : params) {
    std::sort(values.begin(), values.end());
    s += "\n" + name + ":";
    for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "") + values[i];
  }
  return s;
}

std::string sharedKeyAuthorization(const std::string& account, const std::string& key,
                                   const std::string& stringToSign) {
  return "SharedKey " + account + ":" + base64Encode(hmacSha256(key, stringToSign));
}

}  // namespace cohort::storage::detail

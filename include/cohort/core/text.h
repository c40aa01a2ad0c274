#pragma once

// Small text helpers that several parsers share (storage URLs and headers,
// job values, dataset manifests). ASCII only: these are protocol and
// configuration words, not user text.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort {

// The bytes of `s`: what a store value holds.
inline std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

// Whether `c` may be in a name that becomes part of a file name or key
// (a job name, a job id, a node id): a letter, a digit, '.', '_' or '-'.
inline bool isNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}
// A non-empty name of such characters, at most `max` of them, other than
// "." and "..".
inline bool isPortableName(const std::string& s, size_t max = 128) {
  if (s.empty() || s.size() > max || s == "." || s == "..") return false;
  for (char c : s) {
    if (!isNameChar(c)) return false;
  }
  return true;
}

// `s` with A-Z turned into a-z.
inline std::string lowerAscii(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

// `s` without leading and trailing spaces, tabs, CRs and LFs.
inline std::string trimSpace(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// The parts of `s` between `sep`s, each trimmed; empty parts dropped.
inline std::vector<std::string> splitOn(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find(sep, start);
    std::string part = trimSpace(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (!part.empty()) out.push_back(std::move(part));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

// "N" -> {N, N}, "MIN:MAX" -> {MIN, MAX} (counts of nodes, say); nullopt
// when `s` is neither (no digits, a sign, anything after them). The caller
// checks the bounds it needs.
inline std::optional<std::pair<int64_t, int64_t>> parseCountRange(const std::string& s) {
  auto number = [](const std::string& t) -> std::optional<int64_t> {
    if (t.empty() || t.size() > 9) return std::nullopt;
    int64_t v = 0;
    for (const char c : t) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  const size_t colon = s.find(':');
  const auto lo = number(s.substr(0, colon));
  const auto hi = colon == std::string::npos ? lo : number(s.substr(colon + 1));
  if (!lo || !hi) return std::nullopt;
  return std::make_pair(*lo, *hi);
}

// A size for people: "512 B", "3.4 KiB", "12.0 MiB", "1.50 GiB".
inline std::string humanBytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1 << 30));
  } else if (b >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

}  // namespace cohort

#pragma once

// Small text helpers that several parsers share (storage URLs and headers,
// job values, dataset manifests). ASCII only: these are protocol and
// configuration words, not user text.

#include <cstdint>
#include <string>
#include <vector>

namespace cohort {

// The bytes of `s`: what a store value holds.
inline std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

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

}  // namespace cohort

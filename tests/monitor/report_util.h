#pragma once

// Reading back what the report page drew (src/monitor/report_svg.cc marks
// every element a test counts with a class): the same functions read the
// page as cohort wrote it and as Chromium's DOM dump has it.

#include <cstdlib>
#include <string>
#include <vector>

namespace cohort::test {

// The text of <svg id="ID" ...>...</svg>, "" when there is none.
inline std::string svgOf(const std::string& html, const std::string& id) {
  const auto at = html.find("<svg id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const auto end = html.find("</svg>", at);
  return end == std::string::npos ? "" : html.substr(at, end + 6 - at);
}

inline size_t countOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The values of attribute `name` on every element of `text` that has it.
inline std::vector<std::string> attributes(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  const std::string key = " " + name + "=\"";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    const size_t begin = at + key.size();
    out.push_back(text.substr(begin, text.find('"', begin) - begin));
  }
  return out;
}

// The coordinate pairs of each polyline of a plot ("x,y x,y ...").
inline std::vector<size_t> polylinePoints(const std::string& svg) {
  std::vector<size_t> out;
  for (const std::string& p : attributes(svg, "points")) {
    size_t pairs = 0;
    for (char c : p) pairs += c == ',';
    out.push_back(pairs);
  }
  return out;
}

// The sum of the histogram's bins.
inline long binTotal(const std::string& svg) {
  long n = 0;
  for (const std::string& c : attributes(svg, "data-count")) n += std::atol(c.c_str());
  return n;
}

}  // namespace cohort::test

#include "storage/detail/xml.h"

#include <stdexcept>

#include "cohort/core/utf8.h"
#include "storage/detail/shared_key.h"

namespace cohort::storage::detail {
namespace {

struct Element {
  bool found = false;
  std::string attributes;  // raw text between the tag name and '>'
  std::string text;        // raw content, not unescaped
  size_t begin = 0;        // position of the content
  size_t end = 0;          // position after the closing tag
};

// The first <tag ...>...</tag> (or <tag/>) at or after `from` in [from, limit).
Element findElement(const std::string& xml, const std::string& tag, size_t from,
                    size_t limit = std::string::npos) {
  Element e;
  if (limit == std::string::npos) limit = xml.size();
  const std::string open = "<" + tag;
  size_t pos = from;
  while (true) {
    pos = xml.find(open, pos);
    if (pos == std::string::npos || pos >= limit) return e;
    const size_t after = pos + open.size();
    if (after < xml.size() && (xml[after] == '>' || xml[after] == ' ' || xml[after] == '/' ||
                               xml[after] == '\t' || xml[after] == '\n' || xml[after] == '\r')) {
      break;
    }
    pos = after;  // a longer tag name sharing the prefix
  }
  const size_t gt = xml.find('>', pos);
  if (gt == std::string::npos || gt >= limit) return e;
  e.found = true;
  if (xml[gt - 1] == '/') {  // <tag/>
    e.attributes = xml.substr(pos + open.size(), gt - 1 - pos - open.size());
    e.begin = e.end = gt + 1;
    return e;
  }
  e.attributes = xml.substr(pos + open.size(), gt - pos - open.size());
  const std::string close = "</" + tag + ">";
  const size_t c = xml.find(close, gt + 1);
  if (c == std::string::npos || c >= limit) {
    e.found = false;
    return e;
  }
  e.text = xml.substr(gt + 1, c - gt - 1);
  e.begin = gt + 1;
  e.end = c + close.size();
  return e;
}

}  // namespace

std::string xmlUnescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string::npos) {
      out += s[i];
      continue;
    }
    const std::string entity = s.substr(i + 1, semi - i - 1);
    if (entity == "amp") {
      out += '&';
    } else if (entity == "lt") {
      out += '<';
    } else if (entity == "gt") {
      out += '>';
    } else if (entity == "quot") {
      out += '"';
    } else if (entity == "apos") {
      out += '\'';
    } else if (!entity.empty() && entity[0] == '#') {
      unsigned long cp = 0;
      try {
        cp = entity.size() > 1 && (entity[1] == 'x' || entity[1] == 'X')
                 ? std::stoul(entity.substr(2), nullptr, 16)
                 : std::stoul(entity.substr(1), nullptr, 10);
      } catch (const std::exception&) {
        out += s.substr(i, semi - i + 1);
        i = semi;
        continue;
      }
      appendUtf8(out, static_cast<uint32_t>(cp));
    } else {
      out += s.substr(i, semi - i + 1);
    }
    i = semi;
  }
  return out;
}

ListPage parseListPage(const std::string& xml) {
  if (xml.find("<EnumerationResults") == std::string::npos) {
    throw std::runtime_error("not a List Blobs response (no <EnumerationResults>)");
  }
  ListPage page;
  size_t pos = 0;
  while (true) {
    const Element blob = findElement(xml, "Blob", pos);
    if (!blob.found) break;
    const Element name = findElement(xml, "Name", blob.begin, blob.end);
    const Element length = findElement(xml, "Content-Length", blob.begin, blob.end);
    if (!name.found) throw std::runtime_error("a <Blob> without <Name>");
    ListedBlob b;
    b.name = xmlUnescape(name.text);
    if (name.attributes.find("Encoded=\"true\"") != std::string::npos)
      b.name = percentDecode(b.name);
    if (length.found && !length.text.empty()) {
      // Digits only: stoll would also take "-12" or "12abc".
      const bool digits = length.text.size() <= 18 &&
                          length.text.find_first_not_of("0123456789") == std::string::npos;
      if (!digits) throw std::runtime_error("a <Content-Length> that is not a byte count");
      b.size = std::stoll(length.text);
    }
    page.blobs.push_back(std::move(b));
    pos = blob.end;
  }
  const Element marker = findElement(xml, "NextMarker", 0);
  if (marker.found) page.nextMarker = xmlUnescape(marker.text);
  return page;
}

std::string errorCodeFromBody(const std::string& xml) {
  const Element code = findElement(xml, "Code", 0);
  return code.found ? xmlUnescape(code.text) : std::string();
}

}  // namespace cohort::storage::detail

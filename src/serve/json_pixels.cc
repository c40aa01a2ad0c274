#include "serve/detail/json_pixels.h"

#include <charconv>

namespace cohort::serve::detail {

namespace {

// A strict reader of the one shape of body it knows; false from any step
// means "not this shape": the caller gives up and the general parser runs.
class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}

  void skipSpace() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\r' || s_[p_] == '\t')) ++p_;
  }
  bool take(char c) {
    skipSpace();
    if (p_ >= s_.size() || s_[p_] != c) return false;
    ++p_;
    return true;
  }
  bool peek(char c) {
    skipSpace();
    return p_ < s_.size() && s_[p_] == c;
  }
  bool atEnd() {
    skipSpace();
    return p_ == s_.size();
  }
  size_t position() const { return p_; }
  void rewind(size_t p) { p_ = p; }

  // A key without escapes.
  bool key(std::string_view& out) {
    if (!take('"')) return false;
    const size_t start = p_;
    while (p_ < s_.size() && s_[p_] != '"') {
      if (s_[p_] == '\\' || static_cast<unsigned char>(s_[p_]) < 0x20) return false;
      ++p_;
    }
    if (p_ >= s_.size()) return false;
    out = s_.substr(start, p_ - start);
    ++p_;
    return take(':');
  }

  // JSON's number grammar restricted to 0|[1-9][0-9]* with an optional
  // fraction: no sign, no exponent. Read as the general parser does (the
  // closest double), then in float.
  bool pixel(float& out) {
    skipSpace();
    const size_t start = p_;
    if (p_ >= s_.size() || s_[p_] < '0' || s_[p_] > '9') return false;
    if (s_[p_] == '0' && p_ + 1 < s_.size() && s_[p_ + 1] >= '0' && s_[p_ + 1] <= '9') return false;
    while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
    if (p_ < s_.size() && s_[p_] == '.') {
      ++p_;
      const size_t digits = p_;
      while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
      if (p_ == digits) return false;
    }
    if (p_ < s_.size() && (s_[p_] == 'e' || s_[p_] == 'E')) return false;
    double v = 0;
    const auto r = std::from_chars(s_.data() + start, s_.data() + p_, v);
    if (r.ec != std::errc() || r.ptr != s_.data() + p_ || !(v >= 0 && v <= 255)) return false;
    out = static_cast<float>(v);
    return true;
  }

  bool integer(int64_t lo, int64_t hi, int64_t& out) {
    skipSpace();
    const size_t start = p_;
    if (p_ >= s_.size() || s_[p_] < '1' || s_[p_] > '9') return false;
    while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
    if (p_ < s_.size() && (s_[p_] == '.' || s_[p_] == 'e' || s_[p_] == 'E')) return false;
    const auto r = std::from_chars(s_.data() + start, s_.data() + p_, out);
    return r.ec == std::errc() && out >= lo && out <= hi;
  }

  bool boolean(bool& out) {
    skipSpace();
    for (const auto& [word, value] : {std::pair<std::string_view, bool>{"true", true}, {"false", false}}) {
      if (s_.substr(p_, word.size()) == word) {
        p_ += word.size();
        out = value;
        return true;
      }
    }
    return false;
  }

  // [v, v, ...] of exactly `n` pixels, appended to `out`.
  bool row(int64_t n, std::vector<float>& out) {
    if (!take('[')) return false;
    for (int64_t i = 0; i < n; ++i) {
      float v = 0;
      if ((i > 0 && !take(',')) || !pixel(v)) return false;
      out.push_back(v);
    }
    return take(']');
  }

  // [C][H][W] nested arrays.
  bool image(int64_t c, int64_t h, int64_t w, std::vector<float>& out) {
    if (!take('[')) return false;
    for (int64_t ci = 0; ci < c; ++ci) {
      if ((ci > 0 && !take(',')) || !take('[')) return false;
      for (int64_t hi = 0; hi < h; ++hi) {
        if ((hi > 0 && !take(',')) || !row(w, out)) return false;
      }
      if (!take(']')) return false;
    }
    return take(']');
  }

  // How many '[' open the value here (whitespace between them allowed).
  int depth() {
    const size_t start = p_;
    int d = 0;
    while (take('[')) ++d;
    p_ = start;
    return d;
  }

 private:
  std::string_view s_;
  size_t p_ = 0;
};

}  // namespace

std::optional<ScannedPredict> scanPredictJson(std::string_view body, int64_t channels, int64_t height,
                                              int64_t width, int64_t maxInputs) {
  if (channels < 1 || height < 1 || width < 1 || maxInputs < 1) return std::nullopt;
  Scanner s(body);
  ScannedPredict r;
  bool inputs = false;
  if (!s.take('{')) return std::nullopt;
  for (bool first = true; !s.peek('}'); first = false) {
    if (!first && !s.take(',')) return std::nullopt;
    std::string_view key;
    if (!s.key(key)) return std::nullopt;
    if (key == "inputs" && !inputs) {
      inputs = true;
      const int64_t perImage = channels * height * width;
      const int d = s.depth();
      // One image's room; a list grows geometrically from there (an exact
      // reserve per image would copy the whole buffer for every image).
      r.pixels.reserve(static_cast<size_t>(perImage));
      if (d == 3) {
        if (!s.image(channels, height, width, r.pixels)) return std::nullopt;
        r.images = 1;
      } else if (d == 4) {
        s.take('[');
        do {
          if (r.images == maxInputs) return std::nullopt;
          if (!s.image(channels, height, width, r.pixels)) return std::nullopt;
          ++r.images;
        } while (s.take(','));
        if (!s.take(']')) return std::nullopt;
      } else {
        return std::nullopt;
      }
    } else if (key == "top_k" && !r.topK) {
      int64_t k = 0;
      if (!s.integer(1, 1'000'000, k)) return std::nullopt;
      r.topK = k;
    } else if (key == "logits" && !r.logits) {
      bool b = false;
      if (!s.boolean(b)) return std::nullopt;
      r.logits = b;
    } else {
      return std::nullopt;  // another key, or one given twice
    }
  }
  s.take('}');
  if (!inputs || !s.atEnd()) return std::nullopt;
  return r;
}

}  // namespace cohort::serve::detail

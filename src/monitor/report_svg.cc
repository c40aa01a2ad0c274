// The report page's plots, drawn as inline SVG (monitor/report.h): lines
// over a numeric axis with event markers, grouped bars, a histogram.
// Every element a test counts carries a class: a series is one
// <polyline class="series" data-points="N">, with a <circle class="pt"> per
// point when there are few; a bar is <rect class="bar">; a histogram bin is
// <rect class="bin" data-count="n">.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "monitor/detail/report.h"

namespace cohort::monitor::detail {
namespace {

constexpr double kWidth = 580, kHeight = 260;
constexpr double kLeft = 70, kRight = 20, kTop = 34, kBottom = 44;
constexpr size_t kMaxDots = 120;
const char* const kColours[] = {"#1f6fb4", "#d9622b", "#2a9d55", "#8e44ad", "#c0392b", "#7f8c8d"};

const char* colourOf(size_t i) { return kColours[i % (sizeof kColours / sizeof kColours[0])]; }

const char* markerColour(const std::string& kind) {
  if (kind == "failure" || kind == "fenced" || kind == "below_min") return "#c0392b";
  if (kind == "restart" || kind == "resume" || kind == "reform") return "#d9822b";
  if (kind == "stop" || kind == "leave" || kind == "signal") return "#8e44ad";
  return "#2a9d55";
}

struct Range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
};

// A tick's label: as many decimals as the ticks' step needs, so that
// neighbouring ticks never read the same.
std::string tickText(double v, double step) {
  if (std::fabs(v) < step * 1e-6) return "0";
  if (std::fabs(v) >= 1e6 || step < 1e-4) return fmt::format("{:.3g}", v);
  const int decimals = std::max(0, -int(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

// Ticks at 1, 2 or 5 x 10^k covering [lo, hi], which it widens to them.
std::vector<double> niceTicks(Range& r, int wanted) {
  if (r.empty()) r = {0, 1};
  if (r.hi - r.lo < 1e-12 * std::max(1.0, std::fabs(r.hi))) {
    const double pad = r.hi == 0 ? 1 : std::fabs(r.hi) * 0.1;
    r.lo -= pad;
    r.hi += pad;
  }
  const double raw = (r.hi - r.lo) / wanted;
  const double power = std::pow(10, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  r.lo = std::floor(r.lo / step) * step;
  r.hi = std::ceil(r.hi / step) * step;
  std::vector<double> ticks;
  for (double v = r.lo; v <= r.hi + step * 1e-6 && ticks.size() < 40; v += step) ticks.push_back(v);
  return ticks;
}

std::string svgOpen(const std::string& id, const char* kind, const std::string& title) {
  return fmt::format(
      "<svg id=\"{}\" class=\"plot\" data-kind=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" "
      "width=\"{}\" height=\"{}\" role=\"img\" aria-label=\"{}\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n"
      "<text x=\"{}\" y=\"20\" class=\"title\">{}</text>\n",
      id, kind, kWidth, kHeight, kWidth, kHeight, escapeHtml(title), kWidth, kHeight, kLeft, escapeHtml(title));
}

// Axes, grid and tick labels; returns the functions' frame.
struct Frame {
  Range x, y;
  double px(double v) const { return kLeft + (v - x.lo) / (x.hi - x.lo) * (kWidth - kLeft - kRight); }
  double py(double v) const { return kHeight - kBottom - (v - y.lo) / (y.hi - y.lo) * (kHeight - kTop - kBottom); }
};

std::string drawAxes(Frame& f, const std::string& xLabel, const std::string& yLabel, bool xTicks) {
  std::string out;
  const auto yt = niceTicks(f.y, 5);
  const double yStep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double v : yt) {
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>\n", kLeft,
                       f.py(v), kWidth - kRight, f.py(v));
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{}</text>\n", kLeft - 6,
                       f.py(v) + 4, tickText(v, yStep));
  }
  if (xTicks) {
    const auto xt = niceTicks(f.x, 6);
    const double xStep = xt.size() > 1 ? xt[1] - xt[0] : 1;
    for (double v : xt) {
      out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n", f.px(v),
                         kHeight - kBottom + 16, tickText(v, xStep));
    }
  }
  out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"axis\"/>\n", kLeft, kHeight - kBottom,
                     kWidth - kRight, kHeight - kBottom);
  out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"axis\"/>\n", kLeft, kTop, kLeft,
                     kHeight - kBottom);
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"label\" text-anchor=\"middle\">{}</text>\n",
                     (kLeft + kWidth - kRight) / 2, kHeight - 8, escapeHtml(xLabel));
  out += fmt::format("<text x=\"14\" y=\"{:.1f}\" class=\"label\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 14 {:.1f})\">{}</text>\n",
                     (kTop + kHeight - kBottom) / 2, (kTop + kHeight - kBottom) / 2, escapeHtml(yLabel));
  return out;
}

}  // namespace

std::string escapeHtml(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string formatNumber(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6 || a < 1e-3) return fmt::format("{:.3g}", v);
  if (a >= 100) return fmt::format("{:.0f}", v);
  std::string s = fmt::format("{:.4g}", v);
  return s;
}

std::string drawLines(const LineChart& c) {
  Frame f;
  for (const auto& s : c.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      f.x.add(x);
      f.y.add(y);
    }
  }
  for (const auto& m : c.markers) f.x.add(m.x);
  std::string out = svgOpen(c.id, "lines", c.title);
  out += drawAxes(f, c.xLabel, c.yLabel, true);
  for (const auto& m : c.markers) {
    const double x = f.px(m.x);
    out += fmt::format("<g class=\"marker\" data-kind=\"{}\"><title>{}</title>"
                       "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"{}\" stroke-dasharray=\"4 3\"/>"
                       "<text x=\"{:.1f}\" y=\"{}\" class=\"mlabel\" fill=\"{}\">{}</text></g>\n",
                       escapeHtml(m.kind), escapeHtml(m.label), x, kTop, x, kHeight - kBottom, markerColour(m.kind),
                       x + 3, kTop + 10, markerColour(m.kind), escapeHtml(m.kind));
  }
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    std::string points;
    size_t n = 0;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      points += fmt::format("{}{:.1f},{:.1f}", n++ ? " " : "", f.px(x), f.py(y));
    }
    out += fmt::format("<polyline class=\"series\" data-series=\"{}\" data-points=\"{}\" fill=\"none\" "
                       "stroke=\"{}\" stroke-width=\"1.8\" points=\"{}\"/>\n",
                       escapeHtml(s.name), n, colourOf(i), points);
    if (n <= kMaxDots) {
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        out += fmt::format("<circle class=\"pt\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.6\" fill=\"{}\"><title>{}: {} at "
                           "{}</title></circle>\n",
                           f.px(x), f.py(y), colourOf(i), escapeHtml(s.name), formatNumber(y), formatNumber(x));
      }
    }
    if (c.series.size() > 1) {
      const double ly = kTop + 4 + 14 * double(i);
      out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"3\" fill=\"{}\"/>"
                         "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"legend\">{}</text>\n",
                         kWidth - kRight - 150, ly, colourOf(i), kWidth - kRight - 136, ly + 5, escapeHtml(s.name));
    }
  }
  return out + "</svg>\n";
}

std::string drawBars(const BarChart& c) {
  Frame f;
  f.y.add(0);
  for (const auto& b : c.bars) {
    for (double v : b.values) {
      if (v >= 0) f.y.add(v);
    }
  }
  f.x = {0, 1};
  std::string out = svgOpen(c.id, "bars", c.title);
  out += drawAxes(f, "", c.yLabel, false);
  const size_t groups = std::max<size_t>(1, c.groups.size());
  const double slot = (kWidth - kLeft - kRight) / double(std::max<size_t>(1, c.bars.size()));
  const double barWidth = std::min(48.0, slot * 0.7 / double(groups));
  for (size_t i = 0; i < c.bars.size(); ++i) {
    const Bar& b = c.bars[i];
    const double x0 = kLeft + slot * (double(i) + 0.5) - barWidth * double(groups) / 2;
    for (size_t g = 0; g < b.values.size() && g < groups; ++g) {
      const double v = b.values[g];
      if (!(v >= 0)) continue;
      const double top = f.py(v), x = x0 + barWidth * double(g);
      out += fmt::format("<rect class=\"bar\" data-value=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                         "height=\"{:.1f}\" fill=\"{}\"><title>{} {}: {}</title></rect>\n",
                         v, x, top, barWidth - 2, f.py(f.y.lo < 0 ? 0 : f.y.lo) - top, colourOf(g),
                         escapeHtml(b.label), g < c.groups.size() ? escapeHtml(c.groups[g]) : "", formatNumber(v));
      out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"value\" text-anchor=\"middle\">{}</text>\n",
                         x + (barWidth - 2) / 2, top - 4, formatNumber(v));
    }
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"middle\">{}</text>\n",
                       kLeft + slot * (double(i) + 0.5), kHeight - kBottom + 16, escapeHtml(b.label));
  }
  if (c.groups.size() > 1) {
    for (size_t g = 0; g < c.groups.size(); ++g) {
      const double ly = kTop + 4 + 14 * double(g);
      out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"8\" fill=\"{}\"/>"
                         "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"legend\">{}</text>\n",
                         kWidth - kRight - 150, ly, colourOf(g), kWidth - kRight - 136, ly + 8,
                         escapeHtml(c.groups[g]));
    }
  }
  return out + "</svg>\n";
}

std::string drawHistogram(const std::string& id, const std::string& title, const std::string& xLabel,
                          const std::vector<double>& values, int bins) {
  Frame f;
  for (double v : values) f.x.add(v);
  if (f.x.empty()) f.x = {0, 1};
  if (f.x.hi - f.x.lo < 1e-9) {
    f.x.lo -= 0.5;
    f.x.hi += 0.5;
  }
  bins = std::max(1, bins);
  const double width = (f.x.hi - f.x.lo) / bins;
  std::vector<int64_t> counts(size_t(bins), 0);
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    const int b = std::min(bins - 1, int((v - f.x.lo) / width));
    ++counts[size_t(std::max(0, b))];
  }
  f.y = {0, double(*std::max_element(counts.begin(), counts.end()))};
  std::string out = svgOpen(id, "histogram", title);
  Frame axes = f;
  out += drawAxes(axes, xLabel, "steps", true);
  // The axes widened x to round ticks; bins keep their own edges on it.
  for (int b = 0; b < bins; ++b) {
    const double lo = f.x.lo + width * b, hi = lo + width;
    const double x0 = axes.px(lo), x1 = axes.px(hi), top = axes.py(double(counts[size_t(b)]));
    out += fmt::format("<rect class=\"bin\" data-count=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                       "height=\"{:.1f}\" fill=\"#1f6fb4\"><title>{}..{} ms: {} steps</title></rect>\n",
                       counts[size_t(b)], x0, top, std::max(0.5, x1 - x0 - 1), axes.py(0) - top, formatNumber(lo),
                       formatNumber(hi), counts[size_t(b)]);
  }
  return out + "</svg>\n";
}

}  // namespace cohort::monitor::detail

#include "harness/svg_plot.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace sala::harness {

namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.3g}k", v / 1e3);
  if (a >= 100) return fmt::format("{:.0f}", v);
  if (a >= 1) return fmt::format("{:.3g}", v);
  return fmt::format("{:.2g}", v);
}

// "Nice" linear ticks covering [lo, hi].
std::vector<double> lin_ticks(double lo, double hi, int want = 5) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  double raw = (hi - lo) / want, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

struct Panel {
  double x, y, w, h;  // plot area in px
  double x0, x1, y0, y1;
  bool logx = false;
  double px(double v) const {
    double a = logx ? std::log10(std::max(v, 1e-12)) : v;
    double lo = logx ? std::log10(x0) : x0, hi = logx ? std::log10(x1) : x1;
    return x + (hi > lo ? (a - lo) / (hi - lo) : 0.5) * w;
  }
  double py(double v) const { return y + h - (y1 > y0 ? (v - y0) / (y1 - y0) : 0.5) * h; }
};

void frame(std::string& s, const Panel& p, const std::string& title, const std::string& xl,
           const std::string& yl) {
  s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='14' font-weight='bold'>{}</text>\n", p.x,
                   p.y - 10, esc(title));
  s += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='none' stroke='#444'/>\n",
                   p.x, p.y, p.w, p.h);
  s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='middle'>{}</text>\n",
                   p.x + p.w / 2, p.y + p.h + 32, esc(xl));
  s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='middle' "
                   "transform='rotate(-90 {:.1f} {:.1f})'>{}</text>\n",
                   p.x - 42, p.y + p.h / 2, p.x - 42, p.y + p.h / 2, esc(yl));
  std::vector<double> xt;
  if (p.logx) {
    for (double e = std::floor(std::log10(p.x0)); e <= std::ceil(std::log10(p.x1)); e += 1) {
      double v = std::pow(10.0, e);
      if (v >= p.x0 * 0.999 && v <= p.x1 * 1.001) xt.push_back(v);
    }
    if (xt.size() < 2) xt = {p.x0, p.x1};
  } else {
    xt = lin_ticks(p.x0, p.x1);
  }
  for (double v : xt) {
    double X = p.px(v);
    s += fmt::format("<line x1='{:.1f}' y1='{:.1f}' x2='{:.1f}' y2='{:.1f}' stroke='#ddd'/>\n", X, p.y, X, p.y + p.h);
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='10' text-anchor='middle'>{}</text>\n", X,
                     p.y + p.h + 14, num(v));
  }
  for (double v : lin_ticks(p.y0, p.y1)) {
    double Y = p.py(v);
    s += fmt::format("<line x1='{:.1f}' y1='{:.1f}' x2='{:.1f}' y2='{:.1f}' stroke='#ddd'/>\n", p.x, Y, p.x + p.w, Y);
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='10' text-anchor='end'>{}</text>\n", p.x - 4, Y + 3,
                     num(v));
  }
}

void legend(std::string& s, const Panel& p, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    double Y = p.y + 14 + 14 * static_cast<double>(i);
    s += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='10' height='10' fill='{}'/>"
                     "<text x='{:.1f}' y='{:.1f}' font-size='11'>{}</text>\n",
                     p.x + 8, Y - 9, kColors[i % 7], p.x + 22, Y, esc(names[i]));
  }
}

void no_data(std::string& s, const Panel& p) {
  s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='12' text-anchor='middle' fill='#888'>no data</text>\n",
                   p.x + p.w / 2, p.y + p.h / 2);
}

// Empirical CDFs (values in ms) on a log time axis; at most ~600 points per curve.
void cdf_panel(std::string& s, Panel p, const std::string& title,
               const std::vector<std::vector<double>>& series, const std::vector<std::string>& names) {
  double lo = 1e300, hi = 0;
  for (const auto& v : series)
    for (double x : v)
      if (x > 0) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
  p.logx = true;
  p.y0 = 0;
  p.y1 = 1;
  if (hi <= 0) {
    p.x0 = 1;
    p.x1 = 10;
    frame(s, p, title, "ms (log scale)", "fraction of samples");
    no_data(s, p);
    return;
  }
  p.x0 = std::pow(10.0, std::floor(std::log10(lo)));
  p.x1 = std::pow(10.0, std::ceil(std::log10(hi)));
  if (p.x1 <= p.x0) p.x1 = p.x0 * 10;
  frame(s, p, title, "ms (log scale)", "fraction of samples");
  for (size_t k = 0; k < series.size(); ++k) {
    std::vector<double> v;
    for (double x : series[k])
      if (x > 0) v.push_back(x);
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    size_t n = v.size(), step = std::max<size_t>(1, n / 600);
    std::string pts = fmt::format("{:.1f},{:.1f} ", p.px(v[0]), p.py(0));
    for (size_t i = 0; i < n; i += step)
      pts += fmt::format("{:.1f},{:.1f} ", p.px(v[i]), p.py(static_cast<double>(i + 1) / static_cast<double>(n)));
    pts += fmt::format("{:.1f},{:.1f}", p.px(v[n - 1]), p.py(1));
    s += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='1.8'/>\n", pts, kColors[k % 7]);
  }
  legend(s, p, names);
}

}  // namespace

std::string render_bench_svg(const std::vector<TierResult>& tiers, const std::string& title) {
  const double W = 1040, H = 1060;
  std::string s = fmt::format(
      "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif'>\n"
      "<rect width='100%' height='100%' fill='white'/>\n"
      "<text x='{}' y='28' font-size='17' font-weight='bold' text-anchor='middle'>{}</text>\n",
      W, H, W / 2, esc(title));
  std::vector<std::string> names;
  std::vector<std::vector<double>> ttft, itl, e2e;
  for (const auto& t : tiers) {
    names.push_back(fmt::format("{} ({} req, {:.1f} s)", t.label, t.completed, t.duration_s));
    std::vector<double> a, b, c;
    for (const auto& o : t.outputs) {
      if (!o.success) continue;
      a.push_back(o.ttft_s * 1000);
      c.push_back(o.latency_s * 1000);
      for (double x : o.itl) b.push_back(x * 1000);
    }
    ttft.push_back(std::move(a));
    itl.push_back(std::move(b));
    e2e.push_back(std::move(c));
  }
  const double pw = 420, ph = 240, lx = 70, rx = 590;
  cdf_panel(s, Panel{lx, 80, pw, ph, 0, 0, 0, 0}, "Time to first token (CDF)", ttft, names);
  cdf_panel(s, Panel{rx, 80, pw, ph, 0, 0, 0, 0}, "Inter-token latency (CDF)", itl, names);
  cdf_panel(s, Panel{lx, 420, pw, ph, 0, 0, 0, 0}, "End-to-end latency (CDF)", e2e, names);

  // Output tokens per second over time.
  {
    Panel p{rx, 420, pw, ph, 0, 1, 0, 1};
    double maxx = 1, maxy = 0;
    for (const auto& t : tiers) {
      maxx = std::max(maxx, static_cast<double>(t.tokens_per_second.size()));
      for (double v : t.tokens_per_second) maxy = std::max(maxy, v);
    }
    p.x1 = maxx;
    p.y1 = maxy > 0 ? maxy * 1.05 : 1;
    frame(s, p, "Output tokens per second over the run", "seconds since start", "tokens / s");
    for (size_t k = 0; k < tiers.size(); ++k) {
      const auto& v = tiers[k].tokens_per_second;
      if (v.empty()) continue;
      std::string pts;
      for (size_t i = 0; i < v.size(); ++i)
        pts += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", p.px(static_cast<double>(i)), p.py(v[i]),
                           p.px(static_cast<double>(i + 1)), p.py(v[i]));
      s += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='1.5'/>\n", pts, kColors[k % 7]);
    }
    legend(s, p, names);
  }

  // Bars: duration and output throughput per tier.
  auto bars = [&](Panel p, const std::string& ttl, const std::string& yl, auto value) {
    double maxy = 0;
    for (const auto& t : tiers) maxy = std::max(maxy, static_cast<double>(value(t)));
    p.x0 = 0;
    p.x1 = 1;
    p.y0 = 0;
    p.y1 = maxy > 0 ? maxy * 1.15 : 1;
    // Frame without x ticks: draw the y grid by hand through frame() with a dummy x range.
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='14' font-weight='bold'>{}</text>\n", p.x, p.y - 10, esc(ttl));
    s += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='none' stroke='#444'/>\n", p.x, p.y, p.w, p.h);
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='middle' transform='rotate(-90 {:.1f} {:.1f})'>{}</text>\n",
                     p.x - 42, p.y + p.h / 2, p.x - 42, p.y + p.h / 2, esc(yl));
    for (double v : lin_ticks(p.y0, p.y1)) {
      double Y = p.py(v);
      s += fmt::format("<line x1='{:.1f}' y1='{:.1f}' x2='{:.1f}' y2='{:.1f}' stroke='#ddd'/>\n", p.x, Y, p.x + p.w, Y);
      s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='10' text-anchor='end'>{}</text>\n", p.x - 4, Y + 3, num(v));
    }
    size_t n = std::max<size_t>(tiers.size(), 1);
    double slot = p.w / static_cast<double>(n), bw = slot * 0.55;
    for (size_t k = 0; k < tiers.size(); ++k) {
      double v = value(tiers[k]);
      double X = p.x + slot * static_cast<double>(k) + (slot - bw) / 2, Y = p.py(v);
      s += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='{}'/>\n", X, Y, bw,
                       p.y + p.h - Y, kColors[k % 7]);
      s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='middle'>{}</text>\n", X + bw / 2,
                       Y - 4, num(v));
      s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='12' text-anchor='middle'>{}</text>\n", X + bw / 2,
                       p.y + p.h + 16, esc(tiers[k].label));
    }
  };
  bars(Panel{lx, 760, pw, ph, 0, 0, 0, 0}, "Benchmark duration per tier", "seconds",
       [](const TierResult& t) { return t.duration_s; });
  bars(Panel{rx, 760, pw, ph, 0, 0, 0, 0}, "Output token throughput per tier", "tokens / s",
       [](const TierResult& t) { return t.output_throughput; });
  s += "</svg>\n";
  return s;
}

}  // namespace sala::harness

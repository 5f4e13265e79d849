#include "harness/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sala::harness {

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double m = mean(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

double percentile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return 0;
  double pos = q / 100.0 * static_cast<double>(s.size() - 1);
  auto lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, s.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return s[lo] + (s[hi] - s[lo]) * frac;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return percentile_sorted(v, q);
}

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  s.mean = mean(v);
  s.std = stddev(v);
  std::sort(v.begin(), v.end());
  s.p50 = percentile_sorted(v, 50);
  s.p90 = percentile_sorted(v, 90);
  s.p99 = percentile_sorted(v, 99);
  s.max = v.back();
  return s;
}

}  // namespace sala::harness

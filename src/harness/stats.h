// Summary statistics with numpy's definitions (np.mean, np.median, np.percentile with
// linear interpolation). Empty input gives 0, as bench_serving's `np.mean(x or 0)` does.
#pragma once
#include <vector>

namespace sala::harness {

double mean(const std::vector<double>& v);
double stddev(const std::vector<double>& v);  // population (np.std)
// q in [0, 100]; v need not be sorted.
double percentile(std::vector<double> v, double q);
double percentile_sorted(const std::vector<double>& sorted, double q);

struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0, std = 0;
};
Summary summarize(std::vector<double> v);

}  // namespace sala::harness

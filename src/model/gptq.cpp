#include "model/gptq.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/error.h"
#include "core/int4.h"

// LAPACK (OpenBLAS exports it): Cholesky factorisation and inverse, column-major.
extern "C" {
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);
}

namespace sala {

namespace {

// U (row-major upper triangle of the result) with H⁻¹ = Uᵀ U, for a symmetric positive definite
// H [K, K]. A row-major symmetric matrix is its own column-major transpose, so LAPACK's
// column-major lower factor L of H⁻¹ (H⁻¹ = L Lᵀ) read row-major is Lᵀ = U.
std::vector<double> upper_cholesky_of_inverse(std::vector<double> H, int64_t K) {
  const int n = int(K);
  int info = 0;
  dpotrf_("L", &n, H.data(), &n, &info);
  if (info != 0)
    fail("GPTQ: the damped Hessian is not positive definite (LAPACK dpotrf info {}); raise "
         "--damp or give more calibration text", info);
  dpotri_("L", &n, H.data(), &n, &info);
  if (info != 0) fail("GPTQ: inverting the Hessian failed (LAPACK dpotri info {})", info);
  // dpotri left H⁻¹ in the column-major lower triangle = the row-major upper one: mirror it.
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < i; ++j) H[size_t(i * K + j)] = H[size_t(j * K + i)];
  dpotrf_("L", &n, H.data(), &n, &info);
  if (info != 0) fail("GPTQ: the inverse Hessian is not positive definite (info {})", info);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < i; ++j) H[size_t(i * K + j)] = 0.0;
  return H;
}

}  // namespace

Int4Codes rtn_quantize(const float* w, int64_t N, int64_t K, int32_t group) {
  Int4Codes c;
  c.group = group;
  c.words.resize(size_t(N * K / kInt4PerWord));
  c.scales.resize(size_t(N * (K / group)));
  int4_quantize_rtn(w, N, K, group, c.words.data(), c.scales.data());
  return c;
}

std::vector<float> int4_dequantize(const Int4Codes& c, int64_t N, int64_t K) {
  std::vector<float> out(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    int4_dequantize_row(c.words.data() + n * (K / kInt4PerWord),
                        c.scales.data() + n * (K / c.group), K, c.group, out.data() + n * K);
  return out;
}

double reconstruction_error(const float* w, const Int4Codes& codes, int64_t N, int64_t K,
                            const std::vector<double>& H) {
  const std::vector<float> q = int4_dequantize(codes, N, K);
  std::vector<double> e(size_t(N * K)), eh(size_t(N * K));
  for (size_t i = 0; i < e.size(); ++i) e[i] = double(w[i]) - double(q[i]);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(K), int(K), 1.0, e.data(),
              int(K), H.data(), int(K), 0.0, eh.data(), int(K));
  double sum = 0;
  for (size_t i = 0; i < e.size(); ++i) sum += e[i] * eh[i];
  return sum;
}

Int4Codes gptq_quantize(const float* w, int64_t N, int64_t K, std::vector<double> H,
                        const GptqOptions& o) {
  const int64_t G = o.group, groups = K / G, B = std::max<int32_t>(1, o.block);
  if (G <= 0 || K % G != 0 || K % kInt4PerWord != 0)
    fail("GPTQ: group size {} must divide the input width {} (a multiple of 8)", G, K);
  SALA_CHECK(H.size() == size_t(K * K), "Hessian of {} values for K = {}", H.size(), K);
  std::vector<double> W(size_t(N * K));  // [N, K], columns permuted below with act_order
  for (size_t i = 0; i < W.size(); ++i) W[i] = w[i];
  // Inputs that were never active: their weights cannot matter (H says so); quantize them to 0.
  for (int64_t k = 0; k < K; ++k)
    if (H[size_t(k * K + k)] == 0.0) {
      H[size_t(k * K + k)] = 1.0;
      for (int64_t n = 0; n < N; ++n) W[size_t(n * K + k)] = 0.0;
    }
  Int4Codes out;
  out.group = int32_t(G);
  out.scales.assign(size_t(N * groups), 0.f);
  std::vector<float> tmp(static_cast<size_t>(G));
  auto set_scales = [&](int64_t g, const auto& value_at) {  // scales of group g from W values
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < G; ++i) tmp[size_t(i)] = float(value_at(n, g * G + i));
      out.scales[size_t(n * groups + g)] = int4_group_scale(tmp.data(), G);
    }
  };
  // perm[i]: the original column processed i-th.
  std::vector<int64_t> perm(static_cast<size_t>(K));
  std::iota(perm.begin(), perm.end(), 0);
  if (o.act_order) {
    for (int64_t g = 0; g < groups; ++g)  // static groups: from the original W
      set_scales(g, [&](int64_t n, int64_t k) { return W[size_t(n * K + k)]; });
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
      return H[size_t(a * K + a)] > H[size_t(b * K + b)];
    });
    std::vector<double> Wp(W.size()), Hp(H.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < K; ++i) Wp[size_t(n * K + i)] = W[size_t(n * K + perm[size_t(i)])];
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j)
        Hp[size_t(i * K + j)] = H[size_t(perm[size_t(i)] * K + perm[size_t(j)])];
    W.swap(Wp);
    H.swap(Hp);
  }
  double mean_diag = 0;
  for (int64_t k = 0; k < K; ++k) mean_diag += H[size_t(k * K + k)];
  mean_diag /= double(K);
  for (int64_t k = 0; k < K; ++k) H[size_t(k * K + k)] += o.damp * mean_diag;
  const std::vector<double> U = upper_cholesky_of_inverse(std::move(H), K);

  std::vector<int8_t> q(size_t(N * K));  // codes in the original column order
  std::vector<double> err(size_t(N * B));   // [N, B] scaled errors of the block
  for (int64_t i1 = 0; i1 < K; i1 += B) {
    const int64_t i2 = std::min(K, i1 + B), count = i2 - i1;
    for (int64_t i = i1; i < i2; ++i) {
      const int64_t k = perm[size_t(i)], g = k / G;
      if (!o.act_order && i % G == 0)  // a group starts: scales from the updated weights
        set_scales(g, [&](int64_t n, int64_t c) { return W[size_t(n * K + c)]; });
      const double d = U[size_t(i * K + i)];
      for (int64_t n = 0; n < N; ++n) {
        const float s = out.scales[size_t(n * groups + g)];
        const double wv = W[size_t(n * K + i)];
        const int code = int4_quantize(float(wv), s);
        q[size_t(n * K + k)] = int8_t(code);
        const double e = (wv - double(float(code) * s)) / d;
        err[size_t(n * B + (i - i1))] = e;
        for (int64_t j = i + 1; j < i2; ++j) W[size_t(n * K + j)] -= e * U[size_t(i * K + j)];
      }
    }
    if (i2 < K)  // W[:, i2:] -= Err[N, count] · U[i1:i2, i2:]
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(K - i2), int(count),
                  -1.0, err.data(), int(B), U.data() + i1 * K + i2, int(K), 1.0, W.data() + i2,
                  int(K));
  }
  out.words.resize(size_t(N * K / kInt4PerWord));
  for (int64_t n = 0; n < N; ++n)
    int4_pack_row(q.data() + n * K, K, out.words.data() + n * (K / kInt4PerWord));
  return out;
}

}  // namespace sala

#include "harness/py_random.h"

#include <algorithm>

namespace sala::harness {

PyRandom::PyRandom(uint64_t seed) {
  std::vector<uint32_t> key;
  if (seed == 0) key.push_back(0);
  while (seed) {
    key.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  }
  init_by_array(key);
}

void PyRandom::init_genrand(uint32_t s) {
  mt_[0] = s;
  for (mti_ = 1; mti_ < 624; mti_++)
    mt_[mti_] = 1812433253u * (mt_[mti_ - 1] ^ (mt_[mti_ - 1] >> 30)) + static_cast<uint32_t>(mti_);
}

void PyRandom::init_by_array(const std::vector<uint32_t>& key) {
  init_genrand(19650218u);
  size_t i = 1, j = 0, n = key.size();
  for (size_t k = std::max<size_t>(624, n); k; k--) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    i++;
    j++;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
    if (j >= n) j = 0;
  }
  for (size_t k = 623; k; k--) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    i++;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
  mti_ = 624;
}

uint32_t PyRandom::genrand_uint32() {
  static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
  uint32_t y;
  if (mti_ >= 624) {
    int kk;
    for (kk = 0; kk < 624 - 397; kk++) {
      y = (mt_[kk] & 0x80000000u) | (mt_[kk + 1] & 0x7fffffffu);
      mt_[kk] = mt_[kk + 397] ^ (y >> 1) ^ mag01[y & 1u];
    }
    for (; kk < 623; kk++) {
      y = (mt_[kk] & 0x80000000u) | (mt_[kk + 1] & 0x7fffffffu);
      mt_[kk] = mt_[kk + (397 - 624)] ^ (y >> 1) ^ mag01[y & 1u];
    }
    y = (mt_[623] & 0x80000000u) | (mt_[0] & 0x7fffffffu);
    mt_[623] = mt_[396] ^ (y >> 1) ^ mag01[y & 1u];
    mti_ = 0;
  }
  y = mt_[mti_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

uint64_t PyRandom::getrandbits(int k) {
  if (k <= 0) return 0;
  if (k <= 32) return genrand_uint32() >> (32 - k);
  // Python fills 32-bit words little-endian, the last word shifted down.
  uint64_t lo = genrand_uint32();
  uint64_t hi = genrand_uint32() >> (64 - k);
  return lo | (hi << 32);
}

uint64_t PyRandom::randbelow(uint64_t n) {
  int k = 0;
  for (uint64_t t = n; t; t >>= 1) ++k;
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

}  // namespace sala::harness

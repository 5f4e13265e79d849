// The backend factory (backend/factory.cpp): device names to backends, and a clear
// sala::Error (never a crash) for a name this build cannot make.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backend/backend.h"
#include "core/error.h"

namespace sala {
namespace {

std::string error_of(const std::string& device) {
  try {
    make_backend(device, {});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BackendFactory, CpuInBothModes) {
  EXPECT_EQ(make_backend("cpu", {NumericMode::F32, 1})->name(), "cpu");
  EXPECT_EQ(make_backend("cpu", {NumericMode::BF16, 1})->name(), "cpu-bf16");
  const auto devs = backend_devices();
  EXPECT_NE(std::find(devs.begin(), devs.end(), "cpu"), devs.end());
}

TEST(BackendFactory, UnknownDeviceIsAnError) {
  for (const char* d : {"tpu", "", "CPU", "cuda:0"}) {
    const std::string e = error_of(d);
    EXPECT_NE(e.find(fmt::format("device '{}' is unknown", d)), std::string::npos) << e;
    EXPECT_NE(e.find("cpu"), std::string::npos) << e;  // names what this build has
  }
}

#ifndef SALA_HAVE_CUDA
TEST(BackendFactory, CudaWithoutCudaBuildIsAnError) {
  const std::string e = error_of("cuda");
  EXPECT_NE(e.find("no CUDA backend"), std::string::npos) << e;
  EXPECT_NE(e.find("-DSALA_CUDA=ON"), std::string::npos) << e;
  const auto devs = backend_devices();
  EXPECT_EQ(std::find(devs.begin(), devs.end(), "cuda"), devs.end());
}
#endif

}  // namespace
}  // namespace sala

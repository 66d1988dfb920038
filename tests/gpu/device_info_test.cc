// Needs a GPU (label gpu): the CUDA build runs on the device and reports sane properties.
#include "kernels/cuda/device_info.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tokenselect::kernels::cuda {
namespace {

TEST(DeviceInfoGpuTest, ListsDevicesWithSaneProperties) {
  auto devices = ListDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_FALSE(devices->empty());
  for (const DeviceInfo& d : *devices) {
    SCOPED_TRACE(FormatDeviceInfo(d));
    EXPECT_GE(d.compute_major, 8);  // we build for sm_80 and sm_90
    EXPECT_GT(d.multiprocessors, 0);
    EXPECT_GT(d.total_memory_bytes, int64_t{1} << 30);
    EXPECT_LE(d.free_memory_bytes, d.total_memory_bytes);
    EXPECT_GT(d.l2_cache_bytes, 0);
  }
}

TEST(DeviceInfoGpuTest, KernelWritesEveryElement) {
  const int64_t n = (int64_t{1} << 22) + 37;  // odd size, beyond one grid-stride pass
  std::vector<float> host(n, std::nanf(""));
  ASSERT_TRUE(FillAndReadBack(2.5f, n, host.data()).ok());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(host[i], 2.5f) << i;
  EXPECT_EQ(FillAndReadBack(1.0f, 0, host.data()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tokenselect::kernels::cuda

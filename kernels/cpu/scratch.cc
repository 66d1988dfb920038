#include "kernels/cpu/scratch.h"

#include <vector>

namespace tokenselect::kernels::cpu {

float* ThreadScratch(ScratchSlot slot, size_t count) {
  thread_local std::vector<float> buffers[static_cast<int>(ScratchSlot::kCount)];
  std::vector<float>& buffer = buffers[static_cast<int>(slot)];
  if (buffer.size() < count) {
    buffer.clear();
    buffer.shrink_to_fit();  // no copy of the old contents
    buffer.resize(count);
  }
  return buffer.data();
}

}  // namespace tokenselect::kernels::cpu

// A GPU timeline recorder for hosts without Nsight Systems: a CUDA injection library
// (CUDA_INJECTION64_PATH) that records, through CUPTI's activity API, the start and end of every
// kernel, memcpy and memset of the process on every GPU - graph-launched kernels included, each
// with its graph id - and writes them as CSV when the process exits. bench/trace/trace_report.py
// turns the file into per-step breakdowns (where a decode step or a prefill chunk spends its
// time, and how long each GPU sits idle between launches). docs/gpu.md has the recipe:
//
//   CUDA_INJECTION64_PATH=build/bin/libts_cuda_trace.so TS_TRACE_FILE=/tmp/t.csv bench_tp_cuda ...
//
// A "%p" in TS_TRACE_FILE becomes the process id (default: cuda_trace.%p.csv), so that every
// CUDA process of a process tree writes its own file.
//   python3 bench/trace/trace_report.py /tmp/t.csv
//
// File format (one record per line; times in ns of CUPTI's clock, comparable across GPUs):
//   K,<device>,<stream>,<start>,<end>,<graph id or 0>,<grid blocks>,<block threads>,<name id>
//   M,<device>,<stream>,<start>,<end>,<copy kind>,<bytes>     (memcpy)
//   S,<device>,<stream>,<start>,<end>,<bytes>                  (memset)
//   N,<name id>,<demangled kernel name>                        (after the records)
// Records come in buffer order, not time order. Tracing adds a few microseconds per launch on the
// host; kernel durations are the GPU's own.
#include <cupti.h>
#include <cxxabi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 16 << 20;

struct Trace {
  std::mutex mu;
  FILE* out = nullptr;
  std::unordered_map<const char*, int> name_ids;  // CUPTI keeps the name strings alive
  std::vector<std::string> names;
  uint64_t dropped = 0;
};

Trace& GetTrace() {
  static Trace* trace = new Trace();  // never destroyed: exit handlers still use it
  return *trace;
}

int NameId(Trace& t, const char* name) {
  auto it = t.name_ids.find(name);
  if (it != t.name_ids.end()) return it->second;
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string text = status == 0 && demangled != nullptr ? demangled : name;
  std::free(demangled);
  for (char& ch : text) {
    if (ch == ',' || ch == '\n') ch = ';';
  }
  const int id = static_cast<int>(t.names.size());
  t.names.push_back(text);
  t.name_ids.emplace(name, id);
  return id;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Trace& t = GetTrace();
  std::lock_guard<std::mutex> lock(t.mu);
  CUpti_Activity* record = nullptr;
  while (t.out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        std::fprintf(t.out, "K,%u,%u,%llu,%llu,%u,%lld,%d,%d\n", k->deviceId, k->streamId,
                     static_cast<unsigned long long>(k->start),
                     static_cast<unsigned long long>(k->end), k->graphId,
                     static_cast<long long>(k->gridX) * k->gridY * k->gridZ,
                     k->blockX * k->blockY * k->blockZ, NameId(t, k->name));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        std::fprintf(t.out, "M,%u,%u,%llu,%llu,%u,%llu\n", m->deviceId, m->streamId,
                     static_cast<unsigned long long>(m->start),
                     static_cast<unsigned long long>(m->end), m->copyKind,
                     static_cast<unsigned long long>(m->bytes));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* s = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        std::fprintf(t.out, "S,%u,%u,%llu,%llu,%llu\n", s->deviceId, s->streamId,
                     static_cast<unsigned long long>(s->start),
                     static_cast<unsigned long long>(s->end),
                     static_cast<unsigned long long>(s->bytes));
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) {
    t.dropped += dropped;
  }
  std::free(buffer);
}

void Finish() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  Trace& t = GetTrace();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.out == nullptr) return;
  for (size_t i = 0; i < t.names.size(); ++i) {
    std::fprintf(t.out, "N,%zu,%s\n", i, t.names[i].c_str());
  }
  std::fclose(t.out);
  t.out = nullptr;
  std::fprintf(stderr, "cuda_trace: %zu kernel names written, %llu records dropped\n",
               t.names.size(), static_cast<unsigned long long>(t.dropped));
}

bool Check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return true;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "cuda_trace: %s failed: %s\n", what, text != nullptr ? text : "?");
  return false;
}

}  // namespace

// Called by the CUDA driver at initialization when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection() {
  const char* env = std::getenv("TS_TRACE_FILE");
  std::string path = env != nullptr ? env : "cuda_trace.%p.csv";
  if (const size_t at = path.find("%p"); at != std::string::npos) {
    path.replace(at, 2, std::to_string(getpid()));  // one file per process of a process tree
  }
  Trace& t = GetTrace();
  t.out = std::fopen(path.c_str(), "w");
  if (t.out == nullptr) {
    std::fprintf(stderr, "cuda_trace: cannot open %s\n", path.c_str());
    return 0;
  }
  if (!Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "register") ||
      !Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels") ||
      !Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy") ||
      !Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset")) {
    return 0;
  }
  std::atexit(Finish);
  return 1;
}

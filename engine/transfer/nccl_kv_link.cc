// NcclKvLink (nccl_kv_link.h). Per side: options.staging_buffers staging buffers ([256-byte header
// | payload]), their device slot lists with pinned host mirrors, and two streams' worth of events:
//
//   sender   pack stream:  slots H2D, header H2D, [wait kv_ready], KvGather -> packed[b]
//            comm stream:  [wait packed[b]] ncclSend(staging[b]) -> sent[b]
//   receiver comm stream:  ncclRecv(staging[b]) -> received[b]
//            work stream:  slots H2D, [wait received[b]] header D2H -> header[b];
//                          (host checks the header) KvScatter -> scattered[b]
// The comm streams carry nothing but NCCL kernels, so consecutive chunks' kernels follow each
// other without a copy in between.
//
// The staging buffers are plain cudaMalloc memory, not registered with NCCL (ncclMemAlloc +
// ncclCommRegister, zero-copy P2P): measured, registration gained nothing here (bench/
// nccl_kv_bench.cc, docs/kv_transfer.md), and it would add a peer round trip at each buffer's
// first use and the rule that both sides register or neither.
//
// Buffer b = sequence % n (n = options.staging_buffers) is reused by chunk i + n only after the
// host has seen chunk i's last event (sent / scattered), which bounds the pipeline to n chunks in
// flight. The receiver checks chunk i's header and enqueues its scatter during RecvChunk(i + 1),
// after chunk i + 1's receive is queued, so the comm stream never idles on the host.
#include "engine/transfer/nccl_kv_link.h"

#include <nccl.h>

#include <cstring>
#include <thread>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kv_pack.h"

namespace tokenselect::engine {
namespace {

using kernels::cuda::CudaStatus;

constexpr int64_t kHeaderBytes = 256;  // keeps the payload 256-byte aligned
constexpr int kMaxStaging = NcclKvLinkOptions::kMaxStagingBuffers;
constexpr uint64_t kMagic = 0x314c43434e564b54ull;  // "TKVNCCL1", little-endian

// The chunk header, at the start of every staging buffer (docs/kv_transfer.md).
struct ChunkHeader {
  uint64_t magic = kMagic;
  int64_t sequence = 0;
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  int64_t token_begin = 0;
  int64_t token_end = 0;
  int64_t row = 0;
  int64_t payload_bytes = 0;
};
static_assert(sizeof(ChunkHeader) <= kHeaderBytes);

int64_t PayloadBytes(const KvChunkRange& r, int64_t row) {
  return (r.layer_end - r.layer_begin) * 2 * (r.token_end - r.token_begin) * row *
         static_cast<int64_t>(sizeof(__nv_bfloat16));
}

std::string NcclText(ncclResult_t r) { return ncclGetErrorString(r); }

}  // namespace

struct NcclKvLink::Impl {
  NcclKvCache cache;
  NcclKvLinkOptions options;
  int64_t staging_bytes = 0;  // header + largest payload
  ncclComm_t comm = nullptr;
  bool comm_aborted = false;
  cudaStream_t comm_stream = nullptr;
  cudaStream_t work_stream = nullptr;  // packing (sender) or scattering (receiver)
  __nv_bfloat16** k_table = nullptr;   // device [num_layers]
  __nv_bfloat16** v_table = nullptr;
  int num_staging = 0;  // options.staging_buffers
  char* staging[kMaxStaging] = {};
  int32_t* slots_dev[kMaxStaging] = {};
  int32_t* slots_host[kMaxStaging] = {};       // pinned
  ChunkHeader* header_host[kMaxStaging] = {};  // pinned
  cudaEvent_t ready[kMaxStaging] = {};         // sender: packed; receiver: received
  cudaEvent_t done[kMaxStaging] = {};          // sender: sent; receiver: scattered
  cudaEvent_t header[kMaxStaging] = {};        // receiver: header copied to header_host
  bool in_flight[kMaxStaging] = {};            // `done[b]` recorded and not yet waited for
  int64_t sequence = 0;                        // the next chunk's index
  // Receiver: the chunk posted last, whose header is checked and scatter enqueued by the next
  // RecvChunk or Flush.
  bool has_pending = false;
  int pending = 0;
  ChunkHeader expected[kMaxStaging];
  KvChunkRange ranges[kMaxStaging];

  int Buffer(int64_t seq) const { return static_cast<int>(seq % num_staging); }
  absl::Status Allocate(int64_t max_tokens);
  void Free();

  // The header of the next chunk (number `sequence`), which carries `range`.
  ChunkHeader Header(const KvChunkRange& range) const {
    return ChunkHeader{kMagic,
                       sequence,
                       range.layer_begin,
                       range.layer_end,
                       range.token_begin,
                       range.token_end,
                       cache.row,
                       PayloadBytes(range, cache.row)};
  }
  // Copies `slots` into buffer b's pinned mirror and enqueues their H2D copy on the work stream.
  cudaError_t StageSlots(int b, absl::Span<const int32_t> slots) {
    std::memcpy(slots_host[b], slots.data(), slots.size() * sizeof(int32_t));
    return cudaMemcpyAsync(slots_dev[b], slots_host[b], slots.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice, work_stream);
  }
  // The fields KvGatherParams and KvScatterParams share: chunk `range` between buffer b and the
  // cache.
  template <typename Params>
  Params CopyParams(int b, const KvChunkRange& range) const {
    Params p;
    p.k_layers = k_table + range.layer_begin;
    p.v_layers = v_table + range.layer_begin;
    p.staging = reinterpret_cast<__nv_bfloat16*>(staging[b] + kHeaderBytes);
    p.slots = slots_dev[b];
    p.num_layers = range.layer_end - range.layer_begin;
    p.num_tokens = range.token_end - range.token_begin;
    p.row = cache.row;
    p.num_slots = cache.num_slots;
    p.max_blocks = options.copy_blocks;
    return p;
  }
};

// How a wait polls: it yields for the first `spins` polls, then sleeps `nap` between polls; past
// options.timeout it fails with "<what>: <late> <timeout><why>".
struct NcclKvLink::PollPlan {
  int spins;
  absl::Duration nap;
  const char* late;
  const char* why;
};

absl::Status NcclKvLink::Impl::Allocate(int64_t max_tokens) {
  const size_t table_bytes = cache.k_layers.size() * sizeof(__nv_bfloat16*);
  // The comm stream gets the highest priority: its NCCL kernel of chunk i+1 must not queue
  // behind the blocks of chunk i+2's pack (or chunk i's scatter) for free SMs.
  int lowest = 0, highest = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetStreamPriorityRange(&lowest, &highest), "stream priorities"));
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithPriority(&comm_stream, cudaStreamNonBlocking, highest),
                 "cudaStreamCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&work_stream, cudaStreamNonBlocking),
                             "cudaStreamCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&k_table, table_bytes), "cudaMalloc k_table"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&v_table, table_bytes), "cudaMalloc v_table"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(k_table, cache.k_layers.data(), table_bytes, cudaMemcpyHostToDevice), "k_table"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(v_table, cache.v_layers.data(), table_bytes, cudaMemcpyHostToDevice), "v_table"));
  for (int b = 0; b < num_staging; ++b) {
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&staging[b], staging_bytes), "cudaMalloc staging"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMalloc(&slots_dev[b], max_tokens * sizeof(int32_t)), "cudaMalloc slots"));
    RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&slots_host[b], max_tokens * sizeof(int32_t)),
                               "cudaMallocHost slots"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMallocHost(&header_host[b], kHeaderBytes), "cudaMallocHost header"));
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&ready[b], cudaEventDisableTiming), "cudaEventCreate"));
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming), "cudaEventCreate"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&header[b], cudaEventDisableTiming),
                               "cudaEventCreate"));
  }
  return absl::OkStatus();
}

void NcclKvLink::Impl::Free() {
  // After ncclCommAbort the NCCL kernels have stopped, so the streams drain.
  if (comm_stream != nullptr) cudaStreamSynchronize(comm_stream);
  if (work_stream != nullptr) cudaStreamSynchronize(work_stream);
  for (int b = 0; b < kMaxStaging; ++b) {
    if (staging[b] != nullptr) cudaFree(staging[b]);
    if (slots_dev[b] != nullptr) cudaFree(slots_dev[b]);
    if (slots_host[b] != nullptr) cudaFreeHost(slots_host[b]);
    if (header_host[b] != nullptr) cudaFreeHost(header_host[b]);
    if (ready[b] != nullptr) cudaEventDestroy(ready[b]);
    if (done[b] != nullptr) cudaEventDestroy(done[b]);
    if (header[b] != nullptr) cudaEventDestroy(header[b]);
  }
  if (k_table != nullptr) cudaFree(k_table);
  if (v_table != nullptr) cudaFree(v_table);
  if (comm_stream != nullptr) cudaStreamDestroy(comm_stream);
  if (work_stream != nullptr) cudaStreamDestroy(work_stream);
}

absl::StatusOr<std::string> NcclKvLink::CreateUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return absl::InternalError("ncclGetUniqueId: " + NcclText(r));
  static_assert(sizeof(id.internal) == NCCL_UNIQUE_ID_BYTES);
  return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
}

NcclKvLink::NcclKvLink(int rank, int device, std::unique_ptr<Impl> impl)
    : rank_(rank), device_(device), impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<NcclKvLink>> NcclKvLink::Connect(absl::string_view unique_id,
                                                                int rank, int device,
                                                                const NcclKvCache& cache,
                                                                const NcclKvLinkOptions& options) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrCat("unique_id: ", unique_id.size(), " bytes, want ", NCCL_UNIQUE_ID_BYTES));
  }
  if (rank != kSenderRank && rank != kReceiverRank) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", rank, ", want 0 or 1"));
  }
  int devices = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&devices), "cudaGetDeviceCount"));
  if (device < 0 || device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: ", device, " outside [0, ", devices, ")"));
  }
  if (cache.k_layers.empty() || cache.k_layers.size() != cache.v_layers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache.k_layers / v_layers: ", cache.k_layers.size(), " and ",
                     cache.v_layers.size(), " layers"));
  }
  for (size_t l = 0; l < cache.k_layers.size(); ++l) {
    if (cache.k_layers[l] == nullptr || cache.v_layers[l] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("cache: layer ", l, " is null"));
    }
  }
  if (cache.num_slots <= 0 || cache.num_slots > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("cache.num_slots: ", cache.num_slots));
  }
  if (cache.row <= 0) return absl::InvalidArgumentError(absl::StrCat("cache.row: ", cache.row));
  if (options.max_chunk_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.max_chunk_tokens: ", options.max_chunk_tokens));
  }
  if (options.copy_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("options.copy_blocks: ", options.copy_blocks));
  }
  if (options.staging_buffers < 2 || options.staging_buffers > kMaxStaging) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.staging_buffers: ", options.staging_buffers, ", want 2 to ", kMaxStaging));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("options.timeout: must be positive");
  }
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));

  auto impl = std::make_unique<Impl>();
  impl->cache = cache;
  impl->options = options;
  impl->num_staging = options.staging_buffers;
  const int64_t num_layers = static_cast<int64_t>(cache.k_layers.size());
  impl->staging_bytes =
      kHeaderBytes + PayloadBytes({0, num_layers, 0, options.max_chunk_tokens}, cache.row);
  if (absl::Status s = impl->Allocate(options.max_chunk_tokens); !s.ok()) {
    impl->Free();
    return s;
  }

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every NCCL call returns at once; we poll, so a dead peer cannot hang us
  const ncclResult_t r = ncclCommInitRankConfig(&impl->comm, 2, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (impl->comm != nullptr) ncclCommAbort(impl->comm);
    impl->comm = nullptr;
    impl->Free();
    return absl::UnavailableError("ncclCommInitRankConfig: " + NcclText(r));
  }
  std::unique_ptr<NcclKvLink> link(new NcclKvLink(rank, device, std::move(impl)));
  {
    absl::MutexLock lock(&link->mu_);
    RETURN_IF_ERROR(link->WaitNccl("connect (waiting for the peer to join)"));
  }
  return link;
}

NcclKvLink::~NcclKvLink() {
  absl::MutexLock lock(&mu_);
  cudaSetDevice(device_);
  if (health().ok()) {
    // Let the last chunks finish, then leave the communicator together with the peer.
    absl::Status s = FlushLocked();
    if (s.ok()) {
      const ncclResult_t r = ncclCommFinalize(impl_->comm);
      if (r != ncclSuccess && r != ncclInProgress) {
        s = Break(absl::UnavailableError("ncclCommFinalize: " + NcclText(r)));
      } else {
        s = WaitNccl("finalize");
      }
    }
    if (s.ok()) {
      ncclCommDestroy(impl_->comm);
      impl_->comm = nullptr;
    }
  }
  if (impl_->comm != nullptr && !impl_->comm_aborted) ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
  impl_->Free();
}

absl::Status NcclKvLink::health() const {
  absl::MutexLock lock(&err_mu_);
  return error_;
}

absl::Status NcclKvLink::Break(absl::Status error) {
  {
    absl::MutexLock lock(&err_mu_);
    if (error_.ok()) error_ = std::move(error);
  }
  if (impl_->comm != nullptr && !impl_->comm_aborted) {
    ncclCommAbort(impl_->comm);  // stops this side's NCCL kernels; frees the communicator
    impl_->comm_aborted = true;
    impl_->comm = nullptr;
  }
  return health();
}

void NcclKvLink::Abort() {
  abort_requested_.store(true);
  absl::MutexLock lock(&mu_);
  Break(absl::AbortedError("NcclKvLink aborted")).IgnoreError();  // health() keeps it
}

absl::Status NcclKvLink::CheckCuda(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return Break(CudaStatus(e, what));
}

absl::StatusOr<bool> NcclKvLink::NcclIdle(absl::string_view what) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(impl_->comm, &state);
  if (r != ncclSuccess) {
    return Break(absl::InternalError(absl::StrCat(what, ": ncclCommGetAsyncError: ", NcclText(r))));
  }
  if (state == ncclSuccess) return true;
  if (state != ncclInProgress) {
    return Break(absl::UnavailableError(absl::StrCat(what, ": NCCL error ", NcclText(state), " (",
                                                     ncclGetLastError(impl_->comm), ")")));
  }
  return false;
}

absl::Status NcclKvLink::Poll(absl::string_view what, const PollPlan& plan,
                              absl::FunctionRef<absl::StatusOr<bool>()> done) {
  const absl::Time deadline = absl::Now() + impl_->options.timeout;
  for (int polls = 0;; ++polls) {
    ASSIGN_OR_RETURN(const bool finished, done());
    if (finished) return absl::OkStatus();
    if (abort_requested_.load()) return Break(absl::AbortedError("NcclKvLink aborted"));
    if (absl::Now() > deadline) {
      return Break(absl::DeadlineExceededError(absl::StrCat(
          what, ": ", plan.late, " ", absl::FormatDuration(impl_->options.timeout), plan.why)));
    }
    if (polls < plan.spins) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(plan.nap);
    }
  }
}

absl::Status NcclKvLink::WaitNccl(absl::string_view what) {
  static constexpr PollPlan kPlan = {1000, absl::Microseconds(50), "no progress within", ""};
  return Poll(what, kPlan, [&] { return NcclIdle(what); });
}

absl::Status NcclKvLink::Wait(cudaEvent_t event, absl::string_view what) {
  // Spin first (a chunk takes ~0.1-1 ms), then sleep so that a stalled wait costs no core.
  static constexpr PollPlan kPlan = {2000, absl::Microseconds(20), "not done within",
                                     " (peer dead or stalled)"};
  return Poll(what, kPlan, [&]() -> absl::StatusOr<bool> {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) return Break(CudaStatus(e, what));
    RETURN_IF_ERROR(NcclIdle(what).status());  // in progress is fine here: only errors count
    return false;
  });
}

absl::Status NcclKvLink::CheckRange(const KvChunkRange& r, absl::Span<const int32_t> slots) const {
  const int64_t num_layers = static_cast<int64_t>(impl_->cache.k_layers.size());
  if (r.layer_begin < 0 || r.layer_begin >= num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_begin: ", r.layer_begin, " outside [0, ", num_layers, ")"));
  }
  if (r.layer_end <= r.layer_begin || r.layer_end > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer_end: ", r.layer_end, " outside (",
                                                   r.layer_begin, ", ", num_layers, "]"));
  }
  if (r.token_begin < 0) {
    return absl::InvalidArgumentError(absl::StrCat("token_begin: ", r.token_begin, " < 0"));
  }
  if (r.token_end <= r.token_begin ||
      r.token_end - r.token_begin > impl_->options.max_chunk_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_end: ", r.token_end, " gives ", r.token_end - r.token_begin,
                     " tokens, want 1 to max_chunk_tokens ", impl_->options.max_chunk_tokens));
  }
  if (static_cast<int64_t>(slots.size()) != r.token_end - r.token_begin) {
    return absl::InvalidArgumentError(absl::StrCat("slots: ", slots.size(), " slots for ",
                                                   r.token_end - r.token_begin, " tokens"));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0 || slots[i] >= impl_->cache.num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("slots[", i, "]: ", slots[i], " outside [0, ", impl_->cache.num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> NcclKvLink::StartChunk(int rank, const KvChunkRange& range,
                                           absl::Span<const int32_t> slots) {
  RETURN_IF_ERROR(health());
  if (rank_ != rank) {
    return absl::FailedPreconditionError(rank == kSenderRank ? "SendChunk on the receiver"
                                                             : "RecvChunk on the sender");
  }
  RETURN_IF_ERROR(CheckRange(range, slots));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  RETURN_IF_ERROR(Reclaim(impl_->sequence - impl_->num_staging));
  return impl_->Buffer(impl_->sequence);
}

absl::Status NcclKvLink::Reclaim(int64_t i) {
  Impl& m = *impl_;
  if (i < 0) return absl::OkStatus();
  const int b = m.Buffer(i);
  if (!m.in_flight[b]) return absl::OkStatus();
  RETURN_IF_ERROR(
      Wait(m.done[b], absl::StrCat(rank_ == kSenderRank ? "send" : "scatter", " of chunk ", i)));
  m.in_flight[b] = false;
  return absl::OkStatus();
}

absl::Status NcclKvLink::EnqueueTransfer(int b, int64_t bytes) {
  Impl& m = *impl_;
  const bool send = rank_ == kSenderRank;
  // One group per chunk: today a single send or receive (header and payload share the buffer);
  // later per-chunk records (the span index) join the same group.
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess || r == ncclInProgress) {
    const size_t count = static_cast<size_t>(bytes);
    r = send ? ncclSend(m.staging[b], count, ncclUint8, kReceiverRank, m.comm, m.comm_stream)
             : ncclRecv(m.staging[b], count, ncclUint8, kSenderRank, m.comm, m.comm_stream);
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    return Break(absl::UnavailableError(
        absl::StrCat(send ? "ncclSend" : "ncclRecv", " of chunk ", m.sequence, ": ", NcclText(r))));
  }
  return WaitNccl(absl::StrCat("enqueueing chunk ", m.sequence));
}

absl::Status NcclKvLink::SendChunk(const KvChunkRange& range, absl::Span<const int32_t> slots,
                                   cudaEvent_t kv_ready) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const int b, StartChunk(kSenderRank, range, slots));
  Impl& m = *impl_;
  // The contract lets the caller reuse chunk i-2's slots when this call returns: with more than
  // two buffers chunk i-2 may still be on the wire, but its pack (the only reader of the slots)
  // finished long before (packed[] of chunk i-2 is not re-recorded until chunk i-2+n).
  if (m.num_staging > 2 && m.sequence >= 2) {
    RETURN_IF_ERROR(
        Wait(m.ready[m.Buffer(m.sequence - 2)], absl::StrCat("pack of chunk ", m.sequence - 2)));
  }
  *m.header_host[b] = m.Header(range);
  const int64_t payload = m.header_host[b]->payload_bytes;
  RETURN_IF_ERROR(CheckCuda(m.StageSlots(b, slots), "slots H2D"));
  RETURN_IF_ERROR(CheckCuda(cudaMemcpyAsync(m.staging[b], m.header_host[b], sizeof(ChunkHeader),
                                            cudaMemcpyHostToDevice, m.work_stream),
                            "header H2D"));
  if (kv_ready != nullptr) {
    RETURN_IF_ERROR(CheckCuda(cudaStreamWaitEvent(m.work_stream, kv_ready, 0), "wait kv_ready"));
  }
  const auto gather = m.CopyParams<kernels::cuda::KvGatherParams>(b, range);
  RETURN_IF_ERROR(CheckCuda(kernels::cuda::KvGather(gather, m.work_stream), "KvGather"));
  RETURN_IF_ERROR(CheckCuda(cudaEventRecord(m.ready[b], m.work_stream), "record"));
  RETURN_IF_ERROR(CheckCuda(cudaStreamWaitEvent(m.comm_stream, m.ready[b], 0), "wait packed"));
  RETURN_IF_ERROR(EnqueueTransfer(b, kHeaderBytes + payload));
  RETURN_IF_ERROR(CheckCuda(cudaEventRecord(m.done[b], m.comm_stream), "record"));
  m.in_flight[b] = true;
  ++m.sequence;
  chunks_.fetch_add(1);
  bytes_.fetch_add(payload);
  return absl::OkStatus();
}

absl::Status NcclKvLink::RecvChunk(const KvChunkRange& range, absl::Span<const int32_t> slots) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const int b, StartChunk(kReceiverRank, range, slots));
  Impl& m = *impl_;
  m.expected[b] = m.Header(range);
  m.ranges[b] = range;
  RETURN_IF_ERROR(CheckCuda(m.StageSlots(b, slots), "slots H2D"));
  RETURN_IF_ERROR(EnqueueTransfer(b, kHeaderBytes + m.expected[b].payload_bytes));
  RETURN_IF_ERROR(CheckCuda(cudaEventRecord(m.ready[b], m.comm_stream), "record"));
  // Chunk i's receive is queued behind chunk i-1's: now finish chunk i-1 (check, scatter). Its
  // scatter goes on the work stream before chunk i's header copy, which waits for chunk i's
  // receive: the other order would hold the scatter (and so the receive of chunk i+1) back.
  RETURN_IF_ERROR(FinishPendingReceive());
  RETURN_IF_ERROR(CheckCuda(cudaStreamWaitEvent(m.work_stream, m.ready[b], 0), "wait received"));
  RETURN_IF_ERROR(CheckCuda(cudaMemcpyAsync(m.header_host[b], m.staging[b], sizeof(ChunkHeader),
                                            cudaMemcpyDeviceToHost, m.work_stream),
                            "header D2H"));
  RETURN_IF_ERROR(CheckCuda(cudaEventRecord(m.header[b], m.work_stream), "record"));
  m.has_pending = true;
  m.pending = b;
  ++m.sequence;
  return absl::OkStatus();
}

absl::Status NcclKvLink::FinishPendingReceive() {
  Impl& m = *impl_;
  if (!m.has_pending) return absl::OkStatus();
  const int b = m.pending;
  const ChunkHeader& want = m.expected[b];
  RETURN_IF_ERROR(Wait(m.header[b], absl::StrCat("receive of chunk ", want.sequence)));
  m.has_pending = false;
  const ChunkHeader& got = *m.header_host[b];
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"magic", {static_cast<int64_t>(got.magic), static_cast<int64_t>(want.magic)}},
      {"sequence", {got.sequence, want.sequence}},
      {"layer_begin", {got.layer_begin, want.layer_begin}},
      {"layer_end", {got.layer_end, want.layer_end}},
      {"token_begin", {got.token_begin, want.token_begin}},
      {"token_end", {got.token_end, want.token_end}},
      {"row", {got.row, want.row}},
      {"payload_bytes", {got.payload_bytes, want.payload_bytes}},
  };
  for (const auto& [name, values] : fields) {
    if (values.first != values.second) {
      return Break(absl::InvalidArgumentError(
          absl::StrCat("chunk header ", name, ": received ", values.first, ", expected ",
                       values.second, " (chunk ", want.sequence, "; the two plans disagree)")));
    }
  }
  // The work stream already waits for the receive (before the header copy).
  const auto scatter = m.CopyParams<kernels::cuda::KvScatterParams>(b, m.ranges[b]);
  RETURN_IF_ERROR(CheckCuda(kernels::cuda::KvScatter(scatter, m.work_stream), "KvScatter"));
  RETURN_IF_ERROR(CheckCuda(cudaEventRecord(m.done[b], m.work_stream), "record"));
  m.in_flight[b] = true;
  chunks_.fetch_add(1);
  bytes_.fetch_add(want.payload_bytes);
  return absl::OkStatus();
}

absl::Status NcclKvLink::Flush() {
  absl::MutexLock lock(&mu_);
  return FlushLocked();
}

absl::Status NcclKvLink::FlushLocked() {
  RETURN_IF_ERROR(health());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  Impl& m = *impl_;
  if (rank_ == kReceiverRank) RETURN_IF_ERROR(FinishPendingReceive());
  // Oldest first.
  for (int64_t i = m.sequence - m.num_staging; i < m.sequence; ++i) RETURN_IF_ERROR(Reclaim(i));
  return absl::OkStatus();
}

}  // namespace tokenselect::engine

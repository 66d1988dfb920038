// NcclKvLink (engine/transfer/nccl_kv_link.h) between two processes on two GPUs. The test process
// is the receiver (rank 1, GPU 1); it starts itself again with --nccl_kv_child as the sender
// (rank 0, GPU 0; fork + exec, so the child's CUDA and NCCL start clean) and passes the unique id
// on the command line. Both sides derive the same K/V from a seed: the sender writes position p's
// rows into its scrambled slots, the receiver checks every byte of its own (differently)
// scrambled slots and that no other slot changed.
//
// Cases: a full transfer (chunks of 512 tokens, a partial last chunk, one chunk split by layer
// range) with argument checks; the sender SIGKILLed mid-transfer (the receiver errors within its
// timeout, then rebuilds a link with a new unique id and receives everything); the receiver
// aborting (the sender errors within its timeout); two plans that disagree (header check); a
// receiver with 2 staging buffers against a sender with 4. Needs 2 GPUs; skips otherwise.
#include "engine/transfer/nccl_kv_link.h"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tokenselect::engine {
namespace {

using gpu_test::DeviceBuffer;

constexpr int64_t kLayers = 4;
constexpr int64_t kRow = 1024;  // 8 KV heads x 128
constexpr int64_t kPrompt = 2500;
constexpr int64_t kChunk = 512;
constexpr uint16_t kSentinel = 0x7fa5;  // a NaN pattern the value function never produces
const char* kChildFlag = "--nccl_kv_child";

// The chunk plan both sides follow: 512-token chunks (the last one 452), chunk 1 sent as two
// layer halves.
std::vector<KvChunkRange> Plan() {
  std::vector<KvChunkRange> plan;
  for (int64_t t = 0; t < kPrompt; t += kChunk) {
    const int64_t end = std::min(kPrompt, t + kChunk);
    if (t == kChunk) {
      plan.push_back({0, kLayers / 2, t, end});
      plan.push_back({kLayers / 2, kLayers, t, end});
    } else {
      plan.push_back({0, kLayers, t, end});
    }
  }
  return plan;
}

// The bf16 bits of element j of position pos's K (kv = 0) or V row in `layer`: random, finite.
uint16_t Value(int64_t layer, int kv, int64_t pos, int64_t j) {
  uint64_t x = (static_cast<uint64_t>(layer * 2 + kv) << 48) ^ (static_cast<uint64_t>(pos) << 16) ^
               static_cast<uint64_t>(j) ^ 0x9e3779b97f4a7c15ull;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  uint16_t bits = static_cast<uint16_t>(x);
  if ((bits & 0x7f80) == 0x7f80) bits &= 0xbfff;  // no Inf / NaN
  return bits;
}

// slot of every prompt position: pages of `page` slots handed out in a shuffled order.
std::vector<int32_t> ScrambledSlots(int64_t num_slots, int64_t page, uint32_t seed) {
  std::vector<int32_t> pages(num_slots / page);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(seed));
  std::vector<int32_t> slots(kPrompt);
  for (int64_t p = 0; p < kPrompt; ++p) {
    slots[p] = static_cast<int32_t>(pages[p / page] * page + p % page);
  }
  return slots;
}

struct Side {
  int64_t num_slots;
  std::vector<int32_t> slots;                                   // [kPrompt]
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> arrays;  // [2 * layer + kv]
  NcclKvCache cache;
};

// Sender: 16-slot pages in 4096 slots; other slots hold noise. Receiver: 32-slot pages in 8192
// slots, all kSentinel.
Side MakeSide(bool sender) {
  Side s;
  s.num_slots = sender ? 4096 : 8192;
  s.slots = ScrambledSlots(s.num_slots, sender ? 16 : 32, sender ? 11 : 22);
  std::mt19937 noise(5);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      std::vector<uint16_t> h(s.num_slots * kRow, kSentinel);
      if (sender) {
        for (auto& x : h) x = static_cast<uint16_t>(noise()) & 0x3fff;
        for (int64_t p = 0; p < kPrompt; ++p) {
          for (int64_t j = 0; j < kRow; ++j) h[s.slots[p] * kRow + j] = Value(l, kv, p, j);
        }
      }
      s.arrays.push_back(std::make_unique<DeviceBuffer<uint16_t>>(h));
      auto* ptr = reinterpret_cast<__nv_bfloat16*>(s.arrays.back()->get());
      (kv == 0 ? s.cache.k_layers : s.cache.v_layers).push_back(ptr);
    }
  }
  s.cache.num_slots = s.num_slots;
  s.cache.row = kRow;
  return s;
}

// Receiver: every byte of the prompt's rows, and every other slot still kSentinel.
int64_t CountBadRows(const Side& s) {
  std::vector<int64_t> pos_of(s.num_slots, -1);
  for (int64_t p = 0; p < kPrompt; ++p) pos_of[s.slots[p]] = p;
  int64_t bad = 0;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint16_t> h = s.arrays[2 * l + kv]->Download();
      for (int64_t slot = 0; slot < s.num_slots; ++slot) {
        const int64_t p = pos_of[slot];
        for (int64_t j = 0; j < kRow; ++j) {
          const uint16_t want = p >= 0 ? Value(l, kv, p, j) : kSentinel;
          if (h[slot * kRow + j] != want) {
            ++bad;
            break;
          }
        }
      }
    }
  }
  return bad;
}

std::vector<int32_t> SlotsOf(const Side& s, const KvChunkRange& r) {
  return std::vector<int32_t>(s.slots.begin() + r.token_begin, s.slots.begin() + r.token_end);
}

NcclKvLinkOptions Options(int timeout_s, int staging_buffers = 3) {
  NcclKvLinkOptions o;
  o.max_chunk_tokens = kChunk;
  o.timeout = absl::Seconds(timeout_s);
  o.staging_buffers = staging_buffers;
  return o;
}

// ---- the child: the sender (rank 0, GPU 0) ----
// Modes: full (send the plan, flush), full4 (the same with 4 staging buffers), die (send 3 chunks
// then SIGKILL itself), expect_error (send the plan 51 times; exit 0 only if some call fails with
// Unavailable / DeadlineExceeded / Aborted within the timeout), swap (chunks 0 and 2 exchanged; the
// receiver must reject the header; the result here does not matter). Exit codes: 0 as described, 2
// bad usage, 3 connect failed, 4 a send failed in full mode, 5 no error in expect_error mode.
int RunChild(const std::string& mode, const std::string& id_hex) {
  if (id_hex.size() != 256) return 2;
  const std::string id = absl::HexStringToBytes(id_hex);
  const bool full = mode == "full" || mode == "full4";
  const int timeout_s = full ? 30 : 3;
  Side side = MakeSide(/*sender=*/true);
  auto link = NcclKvLink::Connect(id, NcclKvLink::kSenderRank, 0, side.cache,
                                  Options(timeout_s, mode == "full4" ? 4 : 3));
  if (!link.ok()) {
    std::fprintf(stderr, "child: connect: %s\n", link.status().ToString().c_str());
    return 3;
  }
  std::vector<KvChunkRange> plan = Plan();
  if (mode == "swap") std::swap(plan[0], plan[3]);  // both 512 tokens x all layers
  if (mode == "expect_error") {
    // NCCL buffers a send in the receiver's FIFOs without a matching receive (tens of MiB over
    // NVLink), so the plan (20 MiB) alone could complete: repeat it (~1 GiB).
    const std::vector<KvChunkRange> once = plan;
    for (int i = 0; i < 50; ++i) plan.insert(plan.end(), once.begin(), once.end());
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status status;
  for (size_t i = 0; i < plan.size() && status.ok(); ++i) {
    status = (*link)->SendChunk(plan[i], SlotsOf(side, plan[i]));
    if (mode == "die" && i == 2) raise(SIGKILL);
  }
  if (status.ok()) status = (*link)->Flush();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "child %s: %s after %.2f s\n", mode.c_str(), status.ToString().c_str(),
               seconds);
  if (full) return status.ok() ? 0 : 4;
  if (mode == "expect_error") {
    const bool expected =
        absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) || absl::IsAborted(status);
    return expected && seconds < timeout_s + 5 ? 0 : 5;
  }
  return 0;
}

// ---- the parent: the receiver (rank 1, GPU 1) ----
class NcclKvLinkTest : public testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    if (devices < 2) {
      GTEST_SKIP() << "NcclKvLink needs 2 GPUs (sender on GPU 0, receiver on GPU 1); found "
                   << devices;
    }
    TS_CUDA_CHECK(cudaSetDevice(1));
  }
  void TearDown() override {
    if (child_ > 0) {
      kill(child_, SIGKILL);
      waitpid(child_, nullptr, 0);
    }
  }

  // A new unique id, and the sender started with it.
  std::string StartSender(const std::string& mode) {
    auto id = NcclKvLink::CreateUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    const std::string hex = absl::BytesToHexString(*id);
    child_ = fork();
    if (child_ == 0) {
      execl("/proc/self/exe", "nccl_kv_link_test", kChildFlag, mode.c_str(), hex.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    return *id;
  }

  // The child's wait status (waits at most 60 s, then kills it).
  int WaitSender() {
    int status = 0;
    for (int i = 0; i < 600; ++i) {
      if (waitpid(child_, &status, WNOHANG) == child_) {
        child_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "the sender did not exit within 60 s";
    kill(child_, SIGKILL);
    waitpid(child_, &status, 0);
    child_ = -1;
    return status;
  }

  // Receives the whole plan into `side`; the first error.
  absl::Status ReceiveAll(NcclKvLink* link, const Side& side) {
    for (const KvChunkRange& r : Plan()) {
      absl::Status s = link->RecvChunk(r, SlotsOf(side, r));
      if (!s.ok()) return s;
    }
    return link->Flush();
  }

  // The sender in `mode` (full or full4); the receiver with `staging_buffers`.
  void FullTransfer(Side& side, const std::string& mode = "full", int staging_buffers = 3) {
    const std::string id = StartSender(mode);
    auto link = NcclKvLink::Connect(id, NcclKvLink::kReceiverRank, 1, side.cache,
                                    Options(30, staging_buffers));
    ASSERT_TRUE(link.ok()) << link.status();
    ASSERT_TRUE(ReceiveAll(link->get(), side).ok());
    EXPECT_EQ((*link)->chunks(), static_cast<int64_t>(Plan().size()));
    EXPECT_EQ((*link)->bytes(), kLayers * 2 * kPrompt * kRow * 2);
    link->reset();  // finalizes together with the sender
    const int status = WaitSender();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "sender wait status " << status;
    EXPECT_EQ(CountBadRows(side), 0) << "rows differing from the sender's K/V";
  }

  pid_t child_ = -1;
};

TEST_F(NcclKvLinkTest, TransfersEveryByteIntoScrambledSlots) {
  Side side = MakeSide(/*sender=*/false);
  const std::string id = StartSender("full");
  auto link = NcclKvLink::Connect(id, NcclKvLink::kReceiverRank, 1, side.cache, Options(30));
  ASSERT_TRUE(link.ok()) << link.status();
  NcclKvLink& l = **link;

  // Bad arguments name the field and leave the link usable.
  const std::vector<int32_t> s4 = {0, 1, 2, 3};
  auto expect_invalid = [&](const KvChunkRange& r, const std::vector<int32_t>& slots,
                            const char* field) {
    const absl::Status s = l.RecvChunk(r, slots);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(field), absl::string_view::npos) << s;
  };
  expect_invalid({-1, 2, 0, 4}, s4, "layer_begin");
  expect_invalid({0, kLayers + 1, 0, 4}, s4, "layer_end");
  expect_invalid({0, 2, -4, 0}, s4, "token_begin");
  expect_invalid({0, 2, 0, kChunk + 1}, std::vector<int32_t>(kChunk + 1, 0), "token_end");
  expect_invalid({0, 2, 0, 3}, s4, "slots");
  expect_invalid({0, 2, 0, 4}, {0, 1, 8192, 3}, "slots[2]");
  EXPECT_TRUE(absl::IsFailedPrecondition(l.SendChunk({0, 1, 0, 4}, s4)));
  EXPECT_TRUE(l.health().ok());

  ASSERT_TRUE(ReceiveAll(&l, side).ok());
  link->reset();
  const int status = WaitSender();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "sender wait status " << status;
  EXPECT_EQ(CountBadRows(side), 0) << "rows differing from the sender's K/V";
}

TEST_F(NcclKvLinkTest, ConnectRejectsBadArguments) {
  Side side = MakeSide(/*sender=*/false);
  auto bad_id = NcclKvLink::Connect("short", 1, 1, side.cache);
  EXPECT_TRUE(absl::IsInvalidArgument(bad_id.status()));
  EXPECT_NE(bad_id.status().message().find("unique_id"), absl::string_view::npos);
  const std::string id(128, '\0');
  EXPECT_NE(NcclKvLink::Connect(id, 2, 1, side.cache).status().message().find("rank"),
            absl::string_view::npos);
  EXPECT_NE(NcclKvLink::Connect(id, 1, 99, side.cache).status().message().find("device"),
            absl::string_view::npos);
  NcclKvCache empty;
  EXPECT_TRUE(absl::IsInvalidArgument(NcclKvLink::Connect(id, 1, 1, empty).status()));
  for (const int buffers : {1, NcclKvLinkOptions::kMaxStagingBuffers + 1}) {
    const absl::Status s = NcclKvLink::Connect(id, 1, 1, side.cache, Options(3, buffers)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("staging_buffers"), absl::string_view::npos) << s;
  }
}

// Each side picks its pipeline depth: a receiver with 2 staging buffers takes every byte from a
// sender with 4 (its SendChunk runs up to 4 chunks ahead of the receiver's scatters).
TEST_F(NcclKvLinkTest, SidesWithDifferentStagingDepths) {
  Side side = MakeSide(/*sender=*/false);
  FullTransfer(side, "full4", /*staging_buffers=*/2);
}

TEST_F(NcclKvLinkTest, SenderKilledThenRebuilt) {
  Side side = MakeSide(/*sender=*/false);
  constexpr int kTimeout = 3;
  {
    const std::string id = StartSender("die");
    auto link =
        NcclKvLink::Connect(id, NcclKvLink::kReceiverRank, 1, side.cache, Options(kTimeout));
    ASSERT_TRUE(link.ok()) << link.status();
    const auto start = std::chrono::steady_clock::now();
    const absl::Status s = ReceiveAll(link->get(), side);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
    EXPECT_LT(seconds, kTimeout + 3) << s;
    std::printf("receiver after the sender's SIGKILL: %s after %.2f s\n", s.ToString().c_str(),
                seconds);
    EXPECT_EQ((*link)->health(), s);
    EXPECT_EQ((*link)->RecvChunk({0, 1, 0, 1}, {0}), s);  // broken: the first error, always
    const int status = WaitSender();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  }
  // A new link with a new unique id carries the whole prompt again.
  FullTransfer(side);
}

TEST_F(NcclKvLinkTest, ReceiverAbortFailsTheSender) {
  Side side = MakeSide(/*sender=*/false);
  const std::string id = StartSender("expect_error");
  auto link = NcclKvLink::Connect(id, NcclKvLink::kReceiverRank, 1, side.cache, Options(3));
  ASSERT_TRUE(link.ok()) << link.status();
  const std::vector<KvChunkRange> plan = Plan();
  ASSERT_TRUE((*link)->RecvChunk(plan[0], SlotsOf(side, plan[0])).ok());
  (*link)->Abort();
  EXPECT_TRUE(absl::IsAborted((*link)->RecvChunk(plan[1], SlotsOf(side, plan[1]))));
  EXPECT_TRUE(absl::IsAborted((*link)->Flush()));
  link->reset();
  const int status = WaitSender();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the sender did not fail as expected; wait status " << status;
}

TEST_F(NcclKvLinkTest, DisagreeingPlansAreRejectedBeforeScatter) {
  Side side = MakeSide(/*sender=*/false);
  const std::string id = StartSender("swap");
  auto link = NcclKvLink::Connect(id, NcclKvLink::kReceiverRank, 1, side.cache, Options(3));
  ASSERT_TRUE(link.ok()) << link.status();
  const absl::Status s = ReceiveAll(link->get(), side);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("chunk header token_begin"), absl::string_view::npos) << s;
  link->reset();
  WaitSender();
  // Nothing of the rejected chunk 0 was scattered: its slots still hold the sentinel.
  const std::vector<uint16_t> k0 = side.arrays[0]->Download();
  int64_t touched = 0;
  for (int64_t p = 0; p < kChunk; ++p) touched += k0[side.slots[p] * kRow] != kSentinel;
  EXPECT_EQ(touched, 0);
}

}  // namespace
}  // namespace tokenselect::engine

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], tokenselect::engine::kChildFlag) == 0) {
    return tokenselect::engine::RunChild(argv[2], argv[3]);
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

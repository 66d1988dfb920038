// The Cascading KV cache's eviction structure (cascade.h).
//
// CascadeGather: grid-stride, a thread per list entry; every block first reads the (at most 30)
//   sub-caches' heads and sizes into shared memory and finds an entry's sub-cache by a scan.
// CascadeUpdate: one block of 256 threads. The entries are staged in shared memory when they
//   fit in 36 KiB (4608 slots: k + n_local up to that), else worked on in place. The EMA update
//   is a thread per held entry. The pushes go a sub-cache at a time over pieces of up to 512 new
//   tokens (OfferStream): a sub-cache's outcome for its offers depends only on their order, so
//   the sequential rule becomes a few parallel passes per sub-cache (merge each accepted offer
//   with the rejected one after it, append, evict the oldest) - about 6 barriers per sub-cache
//   and piece. (The first version walked every token down the sub-caches on one thread: the
//   dummy Llama-3-8B's TTFT at 128K tokens on an H100 fell from 6.46 s to 4.33 s with this; a
//   call now takes 15 us for a decode step and ~33 us for a 512-token chunk, ncu.) Then the
//   selected set is written a thread per entry.
#include <algorithm>

#include "kernels/cuda/cascade.h"

namespace tokenselect::kernels::cuda {
namespace {

constexpr int kGatherThreads = 256;
constexpr int kUpdateThreads = 256;
constexpr int kPiece = 512;  // new tokens offered at a time (two streams: 8 KiB)
// The staged entries' share of the 48 KiB of shared memory a block gets without opting in.
constexpr int64_t kStagedBytes = 36 * 1024;
constexpr int64_t kEntryBytes = sizeof(int32_t) + sizeof(float);

// A sub-cache's view: where its ring starts, its capacity, head and size.
struct Level {
  int64_t base, capacity, head, size;
};

// Index j of the held entries in the CPU's order (sub-cache 0 first, oldest first) -> the slot
// of its ring. first[i]: entries before sub-cache i; first[S]: all held.
__device__ __forceinline__ int64_t HeldSlot(const Level* levels, const int64_t* first, int S,
                                            int64_t j) {
  int i = 0;
  while (i + 1 < S && first[i + 1] <= j) ++i;
  const Level& l = levels[i];
  return l.base + (l.head + (j - first[i])) % l.capacity;
}

// Thread 0: the sub-caches' layout and state into shared memory.
__device__ void LoadLevels(const CascadeLayer& layer, Level* levels, int64_t* first) {
  int64_t base = 0, held = 0;
  for (int i = 0; i < layer.num_sub_caches; ++i) {
    levels[i] = Level{base, layer.capacity[i], layer.meta[3 * i], layer.meta[3 * i + 1]};
    first[i] = held;
    base += layer.capacity[i];
    held += levels[i].size;
  }
  first[layer.num_sub_caches] = held;
}

__global__ void __launch_bounds__(kGatherThreads) CascadeGatherKernel(CascadeGatherParams p) {
  __shared__ Level levels[kMaxCascadeSubCaches];
  __shared__ int64_t first[kMaxCascadeSubCaches + 1];
  const int S = p.layer.num_sub_caches;
  if (threadIdx.x == 0) LoadLevels(p.layer, levels, first);
  __syncthreads();
  const int64_t held = first[S];
  const int64_t length = held + p.num_tokens - p.next_token;
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.list_length = static_cast<int32_t>(length);
  for (int64_t j = blockIdx.x * int64_t{kGatherThreads} + threadIdx.x; j < length;
       j += int64_t{gridDim.x} * kGatherThreads) {
    const int64_t token =
        j < held ? p.layer.tokens[HeldSlot(levels, first, S, j)] : p.next_token + (j - held);
    p.list_slots[j] = p.token_slots[token];
  }
}

// A stream of entries offered to a sub-cache, in shared memory.
struct Stream {
  int32_t token[kPiece];
  float ema[kPiece];
};

// Offers the stream `in` (length `len`, oldest first) to sub-cache `l` - CascadeCache::Offer for
// each entry in turn - and leaves the entries it evicts, oldest first, in `in` (their count is
// returned). Every thread calls it. The sequential rule, restated so that a thread per entry
// can apply it: a sub-cache i >= 1 with free slots takes the first f offers; once full, an offer
// is accepted when its counter is odd, and a rejected offer meets the current back, which is
// the entry accepted just before it (or, for a first offer rejected, the resident back). So each
// accepted entry enters merged with the rejected one after it (the higher score; ties: the
// accepted one), every accepted entry evicts the oldest, and what a sub-cache appends and evicts
// is a plain FIFO over those merged entries. Sub-cache 0 accepts every offer.
__device__ int64_t OfferStream(Level& l, int64_t& offers, bool first_level, Stream& in,
                               Stream& appended, int64_t len, int32_t* tokens, float* ema) {
  const int64_t cap = l.capacity, size = l.size, head = l.head;
  if (cap == 0) {  // every entry passes through (counted as offered while full)
    __syncthreads();
    if (threadIdx.x == 0 && !first_level) offers += len;
    __syncthreads();
    return len;
  }
  const int64_t f = first_level ? len : (cap - size < len ? cap - size : len);
  const int64_t rest = len - f;      // offered while full
  const bool odd = offers % 2 == 1;  // the first of them is accepted
  const int64_t accepted = odd ? (rest + 1) / 2 : rest / 2;
  const int64_t total = f + accepted;  // entries appended
  for (int64_t j = threadIdx.x; j < total; j += kUpdateThreads) {
    int32_t token;
    float score;
    if (j < f) {
      token = in.token[j];
      score = in.ema[j];
    } else {
      const int64_t a = f + 2 * (j - f) + (odd ? 0 : 1);  // the accepted offer
      token = in.token[a];
      score = in.ema[a];
      if (a + 1 < len && in.ema[a + 1] > score) {  // the rejected one after it
        token = in.token[a + 1];
        score = in.ema[a + 1];
      }
    }
    appended.token[j] = token;
    appended.ema[j] = score;
  }
  __syncthreads();
  if (threadIdx.x == 0 && !odd && rest > 0) {
    // The first full offer is rejected: it meets the back (the last filled entry, or a
    // resident).
    const int64_t r = f;
    if (f > 0) {
      if (in.ema[r] > appended.ema[f - 1]) {
        appended.token[f - 1] = in.token[r];
        appended.ema[f - 1] = in.ema[r];
      }
    } else {
      const int64_t back = l.base + (head + size - 1) % cap;
      if (in.ema[r] > ema[back]) {
        tokens[back] = in.token[r];
        ema[back] = in.ema[r];
      }
    }
  }
  __syncthreads();
  // The FIFO: residents then appended entries; the first `evicted` leave, oldest first.
  const int64_t evicted = size + total > cap ? size + total - cap : 0;
  for (int64_t q = threadIdx.x; q < evicted; q += kUpdateThreads) {
    if (q < size) {
      const int64_t slot = l.base + (head + q) % cap;
      in.token[q] = tokens[slot];
      in.ema[q] = ema[slot];
    } else {
      in.token[q] = appended.token[q - size];
      in.ema[q] = appended.ema[q - size];
    }
  }
  __syncthreads();
  for (int64_t q = (evicted > size ? evicted : size) + threadIdx.x; q < size + total;
       q += kUpdateThreads) {
    const int64_t slot = l.base + (head + q) % cap;
    tokens[slot] = appended.token[q - size];
    ema[slot] = appended.ema[q - size];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    l.head = (head + evicted) % cap;
    l.size = size + total - evicted;
    if (!first_level) offers += rest;
  }
  __syncthreads();
  return evicted;
}

template <bool kStaged>
__global__ void __launch_bounds__(kUpdateThreads) CascadeUpdateKernel(CascadeUpdateParams p) {
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ Level levels[kMaxCascadeSubCaches];
  __shared__ int64_t first[kMaxCascadeSubCaches + 1];
  __shared__ int64_t offers[kMaxCascadeSubCaches];
  __shared__ Stream streams[2];
  const int S = p.layer.num_sub_caches;
  if (threadIdx.x == 0) {
    LoadLevels(p.layer, levels, first);
    for (int i = 0; i < S; ++i) offers[i] = p.layer.meta[3 * i + 2];
  }
  __syncthreads();
  const int64_t total = levels[S - 1].base + levels[S - 1].capacity;
  int32_t* tokens = p.layer.tokens;
  float* ema = p.layer.ema;
  if (kStaged) {
    tokens = reinterpret_cast<int32_t*>(staged);
    ema = reinterpret_cast<float*>(staged + total * sizeof(int32_t));
    for (int64_t j = threadIdx.x; j < total; j += kUpdateThreads) {
      tokens[j] = p.layer.tokens[j];
      ema[j] = p.layer.ema[j];
    }
  }
  __syncthreads();
  // The held entries' EMA, rounded as the CPU rounds it (no fused multiply-add).
  const int64_t held = first[S];
  const float keep = p.decay, take = 1.0f - p.decay;
  for (int64_t j = threadIdx.x; j < held; j += kUpdateThreads) {
    const int64_t slot = HeldSlot(levels, first, S, j);
    ema[slot] = __fadd_rn(__fmul_rn(keep, ema[slot]), __fmul_rn(take, p.vote[j]));
  }
  // The new tokens, a piece at a time through every sub-cache (each sub-cache sees its offers
  // in the same order as with one token at a time).
  for (int64_t begin = p.next_token; begin < p.num_tokens; begin += kPiece) {
    const int64_t len = p.num_tokens - begin < kPiece ? p.num_tokens - begin : kPiece;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < len; j += kUpdateThreads) {
      streams[0].token[j] = static_cast<int32_t>(begin + j);
      streams[0].ema[j] = p.vote[held + (begin - p.next_token) + j];
    }
    __syncthreads();
    int64_t offered = len;
    for (int i = 0; i < S && offered > 0; ++i) {
      offered =
          OfferStream(levels[i], offers[i], i == 0, streams[0], streams[1], offered, tokens, ema);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // The selected set's layout: the sinks, then the sub-caches from the last (oldest) one.
    int64_t at = p.n_init < p.num_tokens ? p.n_init : p.num_tokens;
    for (int i = S - 1; i >= 0; --i) {
      first[i] = at;
      at += levels[i].size;
    }
    first[S] = at;
    *p.num_selected = static_cast<int32_t>(at);
    for (int i = 0; i < S; ++i) {
      p.layer.meta[3 * i] = levels[i].head;
      p.layer.meta[3 * i + 1] = levels[i].size;
      p.layer.meta[3 * i + 2] = offers[i];
    }
  }
  __syncthreads();
  if (kStaged) {
    for (int64_t j = threadIdx.x; j < total; j += kUpdateThreads) {
      p.layer.tokens[j] = tokens[j];
      p.layer.ema[j] = ema[j];
    }
  }
  const int64_t sinks = first[S - 1];
  for (int64_t j = threadIdx.x; j < sinks; j += kUpdateThreads) {
    p.selected[j] = static_cast<int32_t>(j);
  }
  for (int i = 0; i < S; ++i) {
    const Level& l = levels[i];
    for (int64_t q = threadIdx.x; q < l.size; q += kUpdateThreads) {
      p.selected[first[i] + q] = tokens[l.base + (l.head + q) % l.capacity];
    }
  }
}

bool ValidLayer(const CascadeLayer& layer) {
  if (layer.tokens == nullptr || layer.ema == nullptr || layer.meta == nullptr ||
      layer.num_sub_caches < 1 || layer.num_sub_caches > kMaxCascadeSubCaches) {
    return false;
  }
  for (int i = 0; i < layer.num_sub_caches; ++i) {
    if (layer.capacity[i] < 0) return false;
  }
  return true;
}

}  // namespace

int64_t CascadeTotalCapacity(const CascadeLayer& layer) {
  int64_t total = 0;
  for (int i = 0; i < layer.num_sub_caches && i < kMaxCascadeSubCaches; ++i) {
    total += layer.capacity[i];
  }
  return total;
}

cudaError_t CascadeGather(const CascadeGatherParams& p, cudaStream_t stream) {
  if (!ValidLayer(p.layer) || p.list_slots == nullptr || p.list_length == nullptr ||
      p.token_slots == nullptr || p.next_token < 0 || p.num_tokens < p.next_token) {
    return cudaErrorInvalidValue;
  }
  const int64_t bound = CascadeTotalCapacity(p.layer) + (p.num_tokens - p.next_token);
  const int64_t blocks =
      std::clamp<int64_t>((bound + kGatherThreads - 1) / kGatherThreads, 1, 1024);
  CascadeGatherKernel<<<static_cast<unsigned>(blocks), kGatherThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t CascadeUpdate(const CascadeUpdateParams& p, cudaStream_t stream) {
  if (!ValidLayer(p.layer) || p.selected == nullptr || p.num_selected == nullptr ||
      p.vote == nullptr || p.next_token < 0 || p.num_tokens < p.next_token || p.n_init < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t bytes = CascadeTotalCapacity(p.layer) * kEntryBytes;
  if (bytes <= kStagedBytes) {
    CascadeUpdateKernel<true><<<1, kUpdateThreads, static_cast<size_t>(bytes), stream>>>(p);
  } else {
    CascadeUpdateKernel<false><<<1, kUpdateThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace tokenselect::kernels::cuda

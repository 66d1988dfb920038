// Whole steps as one CUDA graph (CudaModel::RunStepGraph): decode steps, and full prefill
// chunks.
//
// A decode step by segments (cuda_model.cc) replays one graph per layer boundary but runs every
// row's selection and attention eagerly: at 1M tokens with tokenselect that is ~15 launches per
// layer whose 1-2 us gaps, and under tensor parallelism a host rendezvous before each eager
// all-reduce, left the GPU idle 10-19% of a step (docs/performance.md). The lengths are what
// keeps that work out of the segment graphs: they grow by one every step. Here the rows' cache
// lengths are copied to the device before each launch and every kernel of the step reads them
// there (CudaAttentionQuery::device_cache_length; grids are sized for a bound), so one graph of
// the whole step (all segments, and each layer's selection, collectives and attention) serves
// every step until a length passes its bound. A prompt's full chunks (max_chunk tokens, no
// logits) get the same treatment, in a graph of their own (a server interleaves chunks and
// decode steps): with TokenSelect, top-k or streaming past the budget the list's bound is
// n_init + k + n_local + max_chunk at every length, so the chunk's launch plan is fixed too.
//
// Key: per row the sequence id, the provider id, the bound (the length rounded up to
// CudaModelOptions::step_graph_bucket, at most the capacity less the new tokens) and the count
// of new tokens. A step whose key differs from the captured graph's runs by segments; the
// second step in a row with the same key captures (so a batch whose composition changes every
// step never pays for captures), or the first with CudaModelOptions::capture_on_first_sight
// (decode steps of one-request generation), where the end of a prompt already captures the
// first decode step (CaptureNextStep: recording and instantiating take ~17 ms of host time at 1M
// tokens, hidden behind the GPU's last prefill chunk; the key is the same, since the step reads
// its length on the device). A new key's capture updates the graph held where the topology is
// the same (cudaGraphExecUpdate: new grids and arguments, no instantiation and no wait for the
// launches in flight, which keep their parameters) and replaces it otherwise. Providers opt in
// per step (SupportsDeviceLength); one that does not keeps the step on segments. Rows on device
// lengths use them by segments too (PlanRows), so a replayed graph and the same step run eagerly
// launch the same kernels with the same grids: bitwise the same results. Host-side statistics of
// such rows come from CudaAttentionProvider::AccountReplay.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/status.h"
#include "engine/model/cuda_model.h"
#include "engine/model/cuda_model_internal.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/decode_attention.h"

namespace tokenselect::engine {
namespace {

namespace kc = kernels::cuda;
using kc::CudaStatus;

}  // namespace

absl::StatusOr<std::vector<CudaModel::RowPlan>> CudaModel::PlanRowBounds(
    absl::Span<const StepRow> rows) {
  Device& d = *dev_;
  std::vector<RowPlan> plan;
  int64_t max_decode_bound = 0;
  for (const StepRow& r : rows) {
    RowPlan p{nullptr, 0};
    ASSIGN_OR_RETURN(p.provider, RowProvider(r));
    const int64_t length = r.seq->length_;
    const int64_t bucket = std::max<int64_t>(1, options_.step_graph_bucket);
    const int64_t bound = std::min(r.seq->capacity() - r.count, (length / bucket + 1) * bucket);
    const bool decode_row = r.count == 1 && r.row == static_cast<int64_t>(plan.size());
    const bool chunk_row = rows.size() == 1 && r.count > 1 && r.count == options_.max_chunk;
    if ((decode_row || chunk_row) && bound >= length && bound <= INT32_MAX &&
        p.provider->SupportsDeviceLength(LayerQuery(0, r), bound)) {
      p.bound = bound;
      if (decode_row) max_decode_bound = std::max(max_decode_bound, bound);
    }
    plan.push_back(p);
  }
  // No allocation may happen later in a decode step (it may be captured): reserve the attention
  // workspace of the longest list a row can reach (splits only grow with the length). A chunk's
  // list bound does not grow with the length (SupportsDeviceLength): its first step, by
  // segments (a chunk's key is captured the second time it comes up), reserved it.
  if (max_decode_bound > 0 && d.tuned_attention) {
    const ModelConfig& c = config_;
    RETURN_IF_ERROR(ReserveAttentionWorkspace(
        kc::DecodeAttentionWorkspaceBytes(1, c.num_heads, c.head_dim,
                                          DecodeSplits(max_decode_bound + 1)),
        /*may_allocate=*/!IsSharded(options_.tp)));
  }
  return plan;
}

absl::StatusOr<std::vector<CudaModel::RowPlan>> CudaModel::PlanRows(
    absl::Span<const StepRow> rows) {
  ASSIGN_OR_RETURN(std::vector<RowPlan> plan, PlanRowBounds(rows));
  if (std::none_of(plan.begin(), plan.end(), [](const RowPlan& p) { return p.bound > 0; })) {
    return plan;
  }
  // The lengths (a pageable copy: staged before the call returns).
  std::vector<int32_t> lengths;
  for (const StepRow& r : rows) lengths.push_back(static_cast<int32_t>(r.seq->length_));
  Device& d = *dev_;
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(d.row_lengths.as<void>(), lengths.data(),
                                             lengths.size() * 4, cudaMemcpyHostToDevice, d.stream),
                             "copy"));
  return plan;
}

std::vector<CudaModel::StepGraphRow> CudaModel::StepGraphKey(absl::Span<const StepRow> rows,
                                                         absl::Span<const RowPlan> plan) {
  std::vector<StepGraphRow> key;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (plan[r].bound == 0) return {};
    key.push_back(
        StepGraphRow{rows[r].seq->id_, plan[r].provider->id(), plan[r].bound, rows[r].count});
  }
  return key;
}

absl::Status CudaModel::DropStepGraph(int kind) {
  Device::WholeStepGraph& g = dev_->whole[kind];
  if (g.exec == nullptr) return absl::OkStatus();
  // Not in flight when destroyed (and the buffers it reads may be replaced next).
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(dev_->stream), "sync"));
  cudaGraphExecDestroy(g.exec);
  g.exec = nullptr;
  g.key.clear();
  return absl::OkStatus();
}

absl::Status CudaModel::CaptureStepGraph(int kind, absl::Span<const StepRow> rows,
                                         absl::Span<const RowPlan> plan, int64_t logits_rows,
                                         const std::vector<StepGraphRow>& key) {
  Device& d = *dev_;
  Device::WholeStepGraph& g = d.whole[kind];
  int64_t m = 0;
  for (const StepRow& r : rows) m += r.count;
  // Capturing records work, it runs none: the stream may still be busy with earlier steps
  // (CaptureNextStep overlaps the capture with a prompt's last chunk; a chunk's capture the
  // chunks before it, which may be replays of the graph about to be updated).
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
  d.capturing = true;
  absl::Status enqueued;
  for (int64_t l = 0; l <= config_.num_layers && enqueued.ok(); ++l) {
    enqueued = EnqueueSegment(l, m, logits_rows);
    if (l == config_.num_layers) break;
    for (size_t r = 0; r < rows.size() && enqueued.ok(); ++r) {
      enqueued = Attention(l, rows[r], d.row_lengths.as<int32_t>() + r, plan[r].bound);
    }
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(d.stream, &graph);
  d.capturing = false;
  bool updated = false;
  if (enqueued.ok() && ended == cudaSuccess) {
    if (g.exec != nullptr) {
      cudaGraphExecUpdateResultInfo info;
      updated = cudaGraphExecUpdate(g.exec, graph, &info) == cudaSuccess;
      if (!updated) {
        cudaGetLastError();  // a different topology: instantiate anew
        enqueued = DropStepGraph(kind);
      }
    }
    if (enqueued.ok() && !updated) {
      const cudaError_t made = cudaGraphInstantiate(&g.exec, graph, 0);
      if (made != cudaSuccess) g.exec = nullptr;
      enqueued = CudaStatus(made, "graph instantiate");
    }
  } else if (enqueued.ok()) {
    enqueued = CudaStatus(ended, "graph capture");
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (enqueued.ok() && !updated) {
    // The upload the first launch would do, in stream order now.
    enqueued = CudaStatus(cudaGraphUpload(g.exec, d.stream), "graph upload");
  }
  if (!enqueued.ok()) {
    cudaGetLastError();
    const absl::Status dropped = DropStepGraph(kind);
    // Under tensor parallelism the ranks must run the same collectives: an error. On one GPU
    // the step runs by segments (which report a real error again) and this key is not
    // captured again.
    if (IsSharded(options_.tp)) return enqueued;
    RETURN_IF_ERROR(dropped);
    std::fprintf(stderr, "CudaModel: whole-step %s graph not captured, running by segments: %s\n",
                 kind == kDecodeGraph ? "decode" : "prefill-chunk", enqueued.ToString().c_str());
    g.failed_key = key;
    return absl::OkStatus();
  }
  g.key = key;
  if (kind == kDecodeGraph) {
    ++step_graph_counts_.captures;
  } else {
    ++(updated ? step_graph_counts_.chunk_updates : step_graph_counts_.chunk_captures);
  }
  return absl::OkStatus();
}

absl::Status CudaModel::CaptureNextStep(CudaSequence* seq, CudaAttentionProvider* attention) {
  Device& d = *dev_;
  if (!options_.use_graphs || !options_.capture_on_first_sight || options_.max_batch < 1 ||
      seq->length_ >= seq->capacity()) {
    return absl::OkStatus();
  }
  const StepRow row{seq, 0, 1, attention};
  const absl::Span<const StepRow> rows = absl::MakeConstSpan(&row, 1);
  ASSIGN_OR_RETURN(const std::vector<RowPlan> plan, PlanRowBounds(rows));
  const std::vector<StepGraphRow> key = StepGraphKey(rows, plan);
  const Device::WholeStepGraph& g = d.whole[kDecodeGraph];
  if (key.empty() || key == g.failed_key || (g.exec != nullptr && key == g.key)) {
    return absl::OkStatus();
  }
  return CaptureStepGraph(kDecodeGraph, rows, plan, /*logits_rows=*/1, key);
}

absl::Status CudaModel::RunStepGraph(int kind, absl::Span<const StepRow> rows,
                                     absl::Span<const RowPlan> plan, int64_t logits_rows,
                                     bool* ran) {
  *ran = false;
  Device& d = *dev_;
  Device::WholeStepGraph& g = d.whole[kind];
  const std::vector<StepGraphRow> key = StepGraphKey(rows, plan);
  if (key.empty()) return absl::OkStatus();
  if (g.exec == nullptr || key != g.key) {
    // First sight: by segments this time (unless the options say decode rows never change).
    const bool first_sight = kind == kDecodeGraph && options_.capture_on_first_sight;
    if ((key != g.seen_key && !first_sight) || key == g.failed_key) {
      g.seen_key = key;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(CaptureStepGraph(kind, rows, plan, logits_rows, key));
    if (g.exec == nullptr || key != g.key) return absl::OkStatus();  // not captured: by segments
  }
  // The graph holds collectives: no rank launches it before all are here.
  if (IsSharded(options_.tp)) RETURN_IF_ERROR(options_.tp->WaitForRanks());
  RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(g.exec, d.stream), "graph launch"));
  ++(kind == kDecodeGraph ? step_graph_counts_.replays : step_graph_counts_.chunk_replays);
  *ran = true;
  return absl::OkStatus();
}

}  // namespace tokenselect::engine

// Whole decode steps as one CUDA graph (CudaModel::RunStepGraph).
//
// A decode step by segments (cuda_model.cc) replays one graph per layer boundary but runs every
// row's selection and attention eagerly: at 1M tokens with tokenselect that is ~15 launches per
// layer whose 1-2 us gaps, and under tensor parallelism a host rendezvous before each eager
// all-reduce, left the GPU idle 10-19% of a step (docs/performance.md). The lengths are what
// keeps that work out of the segment graphs: they grow by one every step. Here the rows' cache
// lengths are copied to the device before each launch and every kernel of the step reads them
// there (CudaAttentionQuery::device_cache_length; grids are sized for a bound), so one graph of
// the whole step (all segments, and each layer's selection, collectives and attention) serves
// every step until a length passes its bound.
//
// Key: per row the sequence id, the provider id and the bound (the length rounded up to
// CudaModelOptions::step_graph_bucket, at most the capacity). A step whose key differs from the captured graph's runs
// by segments; the second step in a row with the same key captures (so a batch whose
// composition changes every step never pays for captures), or the first with
// CudaModelOptions::capture_on_first_sight (one-request generation), where the end of a prompt
// already captures the first decode step (CaptureNextStep: recording and instantiating take
// ~17 ms of host time at 1M tokens, hidden behind the GPU's last prefill chunk; the key is the
// same, since the step reads its length on the device). Providers opt in per step
// (SupportsDeviceLength); one that does not keeps the step on segments. Rows on device lengths
// use them by segments too (PlanRows), so a replayed graph and the same step run eagerly launch
// the same kernels with the same grids: bitwise the same results. Host-side statistics of such
// rows come from CudaAttentionProvider::AccountReplay.
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
  int64_t max_bound = 0;
  for (const StepRow& r : rows) {
    RowPlan p{nullptr, 0};
    ASSIGN_OR_RETURN(p.provider, RowProvider(r));
    const int64_t length = r.seq->length_;
    const int64_t bucket = std::max<int64_t>(1, options_.step_graph_bucket);
    const int64_t bound = std::min(r.seq->capacity() - 1, (length / bucket + 1) * bucket);
    if (r.count == 1 && r.row == static_cast<int64_t>(plan.size()) && bound >= length &&
        bound <= INT32_MAX && p.provider->SupportsDeviceLength(LayerQuery(0, r), bound)) {
      p.bound = bound;
      max_bound = std::max(max_bound, bound);
    }
    plan.push_back(p);
  }
  if (max_bound == 0) return plan;
  // No allocation may happen later in the step (it may be captured): reserve the attention
  // workspace of the longest list a row can reach (splits only grow with the length).
  if (d.tuned_attention) {
    const ModelConfig& c = config_;
    RETURN_IF_ERROR(ReserveAttentionWorkspace(
        kc::DecodeAttentionWorkspaceBytes(1, c.num_heads, c.head_dim, DecodeSplits(max_bound + 1)),
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
    if (plan[r].bound == 0) return {};  // PlanRowBounds: bound > 0 only for count 1
    key.push_back(StepGraphRow{rows[r].seq->id_, plan[r].provider->id(), plan[r].bound});
  }
  return key;
}

absl::Status CudaModel::CaptureStepGraph(absl::Span<const StepRow> rows,
                                         absl::Span<const RowPlan> plan,
                                         const std::vector<StepGraphRow>& key) {
  Device& d = *dev_;
  const int64_t m = static_cast<int64_t>(rows.size());
  if (d.step_graph != nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(d.stream), "sync"));  // not in flight
    cudaGraphExecDestroy(d.step_graph);
    d.step_graph = nullptr;
    d.step_key.clear();
  }
  // Capturing records work, it runs none: the stream may still be busy with earlier steps
  // (CaptureNextStep overlaps the capture with a prompt's last chunk).
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal), "graph capture"));
  absl::Status enqueued;
  for (int64_t l = 0; l <= config_.num_layers && enqueued.ok(); ++l) {
    enqueued = EnqueueSegment(l, m, m);
    if (l == config_.num_layers) break;
    for (int64_t r = 0; r < m && enqueued.ok(); ++r) {
      enqueued = Attention(l, rows[r], d.row_lengths.as<int32_t>() + r, plan[r].bound);
    }
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(d.stream, &graph);
  if (enqueued.ok() && ended == cudaSuccess) {
    const cudaError_t made = cudaGraphInstantiate(&d.step_graph, graph, 0);
    if (made != cudaSuccess) d.step_graph = nullptr;
    enqueued = CudaStatus(made, "graph instantiate");
  } else if (enqueued.ok()) {
    enqueued = CudaStatus(ended, "graph capture");
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (enqueued.ok()) {
    // The upload the first launch would do, in stream order now.
    enqueued = CudaStatus(cudaGraphUpload(d.step_graph, d.stream), "graph upload");
  }
  if (!enqueued.ok()) {
    cudaGetLastError();
    if (d.step_graph != nullptr) {
      cudaGraphExecDestroy(d.step_graph);
      d.step_graph = nullptr;
    }
    // Under tensor parallelism the ranks must run the same collectives: an error. On one GPU
    // the step runs by segments (which report a real error again) and this key is not
    // captured again.
    if (IsSharded(options_.tp)) return enqueued;
    std::fprintf(stderr,
                 "CudaModel: whole-step decode graph not captured, running by segments: %s\n",
                 enqueued.ToString().c_str());
    d.failed_key = key;
    return absl::OkStatus();
  }
  d.step_key = key;
  ++step_graph_counts_.captures;
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
  if (key.empty() || key == d.failed_key || (d.step_graph != nullptr && key == d.step_key)) {
    return absl::OkStatus();
  }
  return CaptureStepGraph(rows, plan, key);
}

absl::Status CudaModel::RunStepGraph(absl::Span<const StepRow> rows,
                                     absl::Span<const RowPlan> plan, bool* ran) {
  *ran = false;
  Device& d = *dev_;
  const std::vector<StepGraphRow> key = StepGraphKey(rows, plan);
  if (key.empty()) return absl::OkStatus();
  if (d.step_graph == nullptr || key != d.step_key) {
    // First sight: by segments this time (unless the options say rows never change).
    if ((key != d.seen_key && !options_.capture_on_first_sight) || key == d.failed_key) {
      d.seen_key = key;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(CaptureStepGraph(rows, plan, key));
    if (d.step_graph == nullptr) return absl::OkStatus();  // not captured: by segments
  }
  // The graph holds collectives: no rank launches it before all are here.
  if (IsSharded(options_.tp)) RETURN_IF_ERROR(options_.tp->WaitForRanks());
  RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(d.step_graph, d.stream), "graph launch"));
  ++step_graph_counts_.replays;
  *ran = true;
  return absl::OkStatus();
}

}  // namespace tokenselect::engine

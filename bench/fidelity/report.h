// Text and JSON renderings of a FidelityReport (fidelity.h; field meanings in docs/fidelity.md).
#ifndef TOKENSELECT_BENCH_FIDELITY_REPORT_H_
#define TOKENSELECT_BENCH_FIDELITY_REPORT_H_

#include <string>

#include "bench/fidelity/fidelity.h"

namespace tokenselect::bench {

// One block per policy (per-layer rows for the decode probe and, when measured, the last
// prefill chunk, then summary rows), followed by a side-by-side summary of every policy.
std::string FormatReport(const FidelityReport& report);

// The same numbers as a JSON document (pretty-printed).
std::string ReportToJson(const FidelityReport& report);

}  // namespace tokenselect::bench

#endif  // TOKENSELECT_BENCH_FIDELITY_REPORT_H_

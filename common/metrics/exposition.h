// Pieces of the Prometheus text exposition format 0.0.4 (docs/metrics.md, "Format"), public so
// that tests and other writers use the same spelling as Registry::Render().
#ifndef TOKENSELECT_COMMON_METRICS_EXPOSITION_H_
#define TOKENSELECT_COMMON_METRICS_EXPOSITION_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tokenselect::common::metrics {

// A sample value: integers up to 2^53 without a fraction ("3"), others in the shortest form that
// reads back to the same double ("0.1", "2.5e-07"), and "NaN", "+Inf", "-Inf".
std::string FormatValue(double value);

// A label value inside double quotes: backslash, double quote and line feed escaped as \\, \"
// and \n.
std::string EscapeLabelValue(absl::string_view value);

// A HELP text: backslash and line feed escaped as \\ and \n.
std::string EscapeHelp(absl::string_view help);

// "{a="x",b="y"}" from names and values of equal length (plus `extra_name`="`extra_value`" last
// when extra_name is non-empty); "" when there is no label at all.
std::string FormatLabels(const std::vector<std::string>& names,
                         const std::vector<std::string>& values, absl::string_view extra_name = "",
                         absl::string_view extra_value = "");

}  // namespace tokenselect::common::metrics

#endif  // TOKENSELECT_COMMON_METRICS_EXPOSITION_H_

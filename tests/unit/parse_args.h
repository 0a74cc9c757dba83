#pragma once
// Runs xdpqd's option parser on a list of arguments (test helper).

#include "control/options.h"

#include <string>
#include <vector>

namespace xdpq::testing {

inline control::Options parse_args(const std::vector<std::string> &args) {
  std::vector<const char *> argv = {"xdpqd"};
  for (const auto &a : args) argv.push_back(a.c_str());
  return control::parse_options(static_cast<int>(argv.size()), argv.data());
}

// The UsageError message for args, or "" when they parse.
inline std::string parse_error(const std::vector<std::string> &args) {
  try {
    parse_args(args);
  } catch (const control::UsageError &e) {
    return e.what();
  }
  return "";
}

} // namespace xdpq::testing

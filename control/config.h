#pragma once
// xdpqd's configuration file (TOML). Every key maps onto the command-line
// flag of the same meaning, so one validator serves both and flags given on
// the command line override the file.

#include "control/options.h"

#include <string>
#include <vector>

namespace xdpq::control {

// Reads path and returns the equivalent flags, in file order. Throws
// UsageError naming the file, the line, the key and what was expected (bad
// syntax, unknown section or key, wrong type, missing file).
std::vector<std::string> config_file_flags(const std::string &path);

// The documented default configuration (every key, with its default).
const char *default_config_text();

// The keys ("section.name", "[[proxy]]") whose values differ between two
// config_file_flags() results, in file order, but for those in except
// (keys, or "section.*" for a whole section) and those whose flag the
// command line gives (args: the process's arguments), which overrides the
// file: these go to *overridden, if given, excepted or not.
std::vector<std::string> changed_config_keys(const std::vector<std::string> &before,
                                             const std::vector<std::string> &after,
                                             const std::vector<std::string_view> &except,
                                             const std::vector<std::string> &args = {},
                                             std::vector<std::string> *overridden = nullptr);

} // namespace xdpq::control

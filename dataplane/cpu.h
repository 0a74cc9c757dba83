#pragma once
// CPU lists ("0-3,6") and pinning the calling thread.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xdpq::dataplane {

// Parses a Linux CPU list. nullopt with a reason in *why on error.
std::optional<std::vector<int>> parse_cpu_list(std::string_view text, std::string *why = nullptr);

// Pins the calling thread to cpu. Returns 0 or an errno value.
int pin_current_thread(int cpu);

// Number of CPUs this process may run on.
int available_cpus();

} // namespace xdpq::dataplane

#include "dataplane/cpu.h"

#include <pthread.h>
#include <sched.h>

#include <charconv>

namespace xdpq::dataplane {

std::optional<std::vector<int>> parse_cpu_list(std::string_view text, std::string *why) {
  std::vector<int> cpus;
  auto fail = [&](std::string reason) -> std::optional<std::vector<int>> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  auto number = [](std::string_view s, int &v) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc{} && end == s.data() + s.size() && v >= 0 &&
           v < CPU_SETSIZE;
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    auto comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    auto item = text.substr(pos, comma - pos);
    auto dash = item.find('-');
    int a = 0, b = 0;
    if (dash == std::string_view::npos) {
      if (!number(item, a)) return fail("'" + std::string(item) + "' is not a CPU number");
      b = a;
    } else if (!number(item.substr(0, dash), a) || !number(item.substr(dash + 1), b) || b < a) {
      return fail("'" + std::string(item) + "' is not a CPU range like 2-5");
    }
    for (int c = a; c <= b; ++c) cpus.push_back(c);
    pos = comma + 1;
  }
  if (cpus.empty()) return fail("empty CPU list");
  return cpus;
}

int pin_current_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return CPU_COUNT(&set);
}

} // namespace xdpq::dataplane

#pragma once
// Leveled logging to stderr, one line per call, safe from any thread.
// journald picks the lines up (and their <N> priority prefixes) when xdpqd
// runs under systemd. Hot paths log only at debug level, behind a check.

#include <cstdarg>
#include <optional>
#include <string_view>

namespace xdpq::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

void set_level(Level level);
Level level();
std::optional<Level> parse_level(std::string_view text);
inline bool enabled(Level l) { return static_cast<int>(l) <= static_cast<int>(level()); }

void write(Level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

} // namespace xdpq::log

#define XDPQ_LOG(lvl, ...)                                                                         \
  do {                                                                                             \
    if (::xdpq::log::enabled(::xdpq::log::Level::lvl)) {                                           \
      ::xdpq::log::write(::xdpq::log::Level::lvl, __VA_ARGS__);                                    \
    }                                                                                              \
  } while (0)
#define LOG_ERROR(...) XDPQ_LOG(error, __VA_ARGS__)
#define LOG_WARN(...) XDPQ_LOG(warn, __VA_ARGS__)
#define LOG_INFO(...) XDPQ_LOG(info, __VA_ARGS__)
#define LOG_DEBUG(...) XDPQ_LOG(debug, __VA_ARGS__)

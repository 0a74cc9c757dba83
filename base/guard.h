#pragma once
// Calls from C libraries (ngtcp2, nghttp3, nghttp2, http-parser, GnuTLS,
// OpenSSL) into our code: no C++ exception may unwind through their frames
// (undefined behaviour). Every callback body runs inside guarded(), which
// turns an exception (std::bad_alloc, above all) into the library's own
// failure value, so the library fails the one connection or stream cleanly.

#include <exception>
#include <utility>

namespace xdpq {

// Logs an exception stopped at a C boundary (rate-limited).
void log_guarded_exception(const char *what) noexcept;

template <typename F, typename R> R guarded(F &&f, R failure) noexcept {
  try {
    return std::forward<F>(f)();
  } catch (const std::exception &e) {
    log_guarded_exception(e.what());
  } catch (...) {
    log_guarded_exception("unknown exception");
  }
  return failure;
}

// For callbacks that return nothing.
template <typename F> void guarded_void(F &&f) noexcept {
  try {
    std::forward<F>(f)();
  } catch (const std::exception &e) {
    log_guarded_exception(e.what());
  } catch (...) {
    log_guarded_exception("unknown exception");
  }
}

} // namespace xdpq

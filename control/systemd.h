#pragma once
// The sd_notify protocol (a datagram to $NOTIFY_SOCKET), without libsystemd.

#include <cstdint>

namespace xdpq::control {

// Sends state ("READY=1", "STOPPING=1", "WATCHDOG=1", ...) if xdpqd runs
// under systemd with Type=notify; a no-op otherwise.
void sd_notify_state(const char *state);

// The watchdog interval systemd asked for (WATCHDOG_USEC), in microseconds;
// 0 when there is none (or it is meant for another process).
uint64_t sd_watchdog_usec();

} // namespace xdpq::control

// The TOML configuration file and the option checks behind it: errors
// must come back as UsageError, never as a crash or another exception.

#include "control/config.h"
#include "control/options.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = memfd_create("xdpq-fuzz-config", 0);
  if (fd < 0)
    return 0;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    return 0;
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  const char *argv[] = {"xdpqd", "--config", path.c_str()};
  try {
    xdpq::control::parse_options(3, argv);
  } catch (const xdpq::control::UsageError &) {
    // The expected answer to a bad file.
  }
  return 0;
}

#include "dataplane/handoff_ring.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace xdpq::dataplane {

namespace {
size_t stride_of(size_t capacity) {
  return (HandoffRing::region_bytes(capacity) + 4095) & ~size_t{4095};
}
[[noreturn]] void fail(const char *what) {
  throw std::runtime_error(std::string("hand-off region: ") + what + ": " + std::strerror(errno));
}
} // namespace

HandoffRegion::HandoffRegion(size_t count, size_t capacity)
    : count_(count), capacity_(capacity), stride_(stride_of(capacity)) {
  fd_ = memfd_create("xdpq-handoff", MFD_CLOEXEC);
  if (fd_ < 0) fail("memfd_create");
  bytes_ = count_ * stride_;
  if (ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
    close(fd_);
    fail("ftruncate");
  }
  map(true);
}

HandoffRegion::HandoffRegion(int fd, size_t count, size_t capacity)
    : count_(count), capacity_(capacity), stride_(stride_of(capacity)), fd_(fd) {
  bytes_ = count_ * stride_;
  struct stat st {};
  if (fstat(fd_, &st) != 0) fail("fstat");
  if (static_cast<size_t>(st.st_size) != bytes_) {
    errno = EINVAL;
    fail("size does not match its ring count and capacity");
  }
  map(false);
}

void HandoffRegion::map(bool init) {
  if (bytes_ == 0) return;
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    if (init) close(fd_); // ours; an adopted fd stays the caller's
    fd_ = -1;
    fail("mmap");
  }
  for (size_t i = 0; i < count_; ++i) {
    rings_.push_back(
        std::make_unique<HandoffRing>(static_cast<std::byte *>(base_) + i * stride_, capacity_, init));
  }
}

HandoffRegion::~HandoffRegion() {
  rings_.clear();
  if (base_) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

} // namespace xdpq::dataplane

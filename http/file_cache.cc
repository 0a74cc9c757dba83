#include "http/file_cache.h"

#include "http/static_files.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace xdpq::http {

// Non-blocking: opening a FIFO for reading would otherwise wait for a
// writer, in the worker's thread.
int open_beneath(int dirfd, const char *rel) {
  struct open_how how {};
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(syscall(SYS_openat2, dirfd, *rel ? rel : ".", &how, sizeof(how)));
}

namespace {

thread_local uint64_t descriptors_refused = 0; // over every cache of the thread

uint64_t ns_of(const struct timespec &t) {
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(t.tv_nsec);
}

FileCache::Status status_for_errno(int err) {
  switch (err) {
  case ENOENT:
  case ENOTDIR:
  case ENAMETOOLONG:
    return FileCache::Status::not_found;
  // EXDEV/ELOOP: the path resolved outside the root.
  case EACCES:
  case EPERM:
  case EXDEV:
  case ELOOP:
  // A socket file (ENXIO) or a device without a driver (ENODEV): not
  // something to serve, and not a fault of the server to retry.
  case ENXIO:
  case ENODEV:
    return FileCache::Status::forbidden;
  default:
    return FileCache::Status::unavailable; // EMFILE, ENOMEM, EIO...
  }
}

} // namespace

uint64_t file_descriptors_refused() { return descriptors_refused; }

bool has_hidden_segment(std::string_view rel) {
  size_t pos = 0;
  while (pos < rel.size()) {
    size_t slash = rel.find('/', pos);
    if (slash == std::string_view::npos)
      slash = rel.size();
    std::string_view seg = rel.substr(pos, slash - pos);
    if (!seg.empty() && seg.front() == '.' && seg != ".well-known")
      return true;
    pos = slash + 1;
  }
  return false;
}

bool FileEntry::changed_on_disk() const {
  struct stat st {};
  if (fstat(fd, &st) != 0) return true;
  if (static_cast<uint64_t>(st.st_size) != size || ns_of(st.st_mtim) != mtime_ns) return true;
  // The ctime too, while its names are those it had: written with its
  // mtime put back (cp -p, rsync -t --inplace), or else renamed, its mode
  // or owner changed (a response cut for nothing, rarely). Not once a name
  // came or went: another file renamed over it (an atomic replace), a
  // hard-link snapshot of the docroot (cp -al, rsync --link-dest) change
  // the ctime, and its bytes are still this version's.
  return st.st_nlink == nlink && ns_of(st.st_ctim) != ctime_ns;
}

FileEntry::~FileEntry() {
  if (fd >= 0) {
    close(fd);
    if (fds) *fds -= 1;
  }
  if (held) *held -= bytes.size();
}

FileCache::FileCache(int root_fd, const FileCacheLimits &limits)
    : root_fd_(root_fd), limits_(limits) {}

// Resolved through an O_PATH descriptor, which opens nothing: a device
// node's driver never runs (opening /dev/watchdog arms it), a FIFO's
// writer is not woken, and a check of an unchanged file reads nothing.
// (One swapped in between this look and the open is opened, non-blocking,
// and refused: open_entry() finds another inode.)
FileCache::Status FileCache::look(const std::string &rel, Looked &l) const {
  auto stat_beneath = [&](const char *path) {
    struct open_how how {};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    const int fd = static_cast<int>(
        syscall(SYS_openat2, root_fd_, *path ? path : ".", &how, sizeof(how)));
    if (fd < 0) return status_for_errno(errno);
    const int r = fstat(fd, &l.st);
    const int err = errno;
    close(fd);
    return r == 0 ? Status::ok : status_for_errno(err);
  };
  l.path = rel;
  l.directory = false;
  Status st = stat_beneath(l.path.c_str());
  if (st != Status::ok) return st;
  if (S_ISDIR(l.st.st_mode)) {
    // Beneath the root, not the directory: an index.html that links to
    // elsewhere in the docroot is served as its own path would be.
    l.directory = true;
    l.path = rel.empty() ? "index.html" : rel + "/index.html";
    st = stat_beneath(l.path.c_str());
    if (st != Status::ok) return st;
  }
  // FIFO, socket, device: never opened in a worker.
  return S_ISREG(l.st.st_mode) ? Status::ok : Status::forbidden;
}

bool FileCache::fits_in_memory(uint64_t size) const {
  // What responses still hold of entries that left the cache (or never
  // entered it) must leave room: a client that stalls many responses of
  // files cycled through the cache must not have each keep its own copy
  // beyond the bound.
  const size_t outside = *held_ - stats_.bytes;
  return size <= limits_.max_file_in_memory && size <= limits_.max_bytes &&
         outside + size <= limits_.max_bytes;
}

FileCache::Status FileCache::open_entry(const Looked &l, std::shared_ptr<const FileEntry> &out) {
  int fd = open_beneath(root_fd_, l.path.c_str());
  if (fd < 0)
    return status_for_errno(errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return status_for_errno(err);
  }
  if (st.st_ino != l.st.st_ino || st.st_dev != l.st.st_dev) {
    close(fd); // replaced since it was looked at: asked again next time
    return Status::unavailable;
  }
  const std::string_view type_path = l.directory ? std::string_view("index.html") : l.path;
  auto e = std::make_shared<FileEntry>();
  e->fd = fd;
  e->directory = l.directory;
  e->size = static_cast<uint64_t>(st.st_size);
  e->ino = st.st_ino;
  e->dev = st.st_dev;
  e->mtime_ns = ns_of(st.st_mtim);
  e->ctime_ns = ns_of(st.st_ctim);
  e->nlink = static_cast<uint64_t>(st.st_nlink);
  char etag[96];
  std::snprintf(etag, sizeof(etag), "\"%llx-%llx-%llx-%llx\"",
                static_cast<unsigned long long>(e->ino), static_cast<unsigned long long>(e->size),
                static_cast<unsigned long long>(e->mtime_ns),
                static_cast<unsigned long long>(e->ctime_ns));
  e->etag = etag;
  e->content_type = content_type_for(type_path);
  // In memory when small, and when there is room (fits_in_memory()).
  if (fits_in_memory(e->size)) {
    e->bytes.resize(e->size);
    size_t got = 0;
    while (got < e->size) {
      ssize_t n = pread(fd, e->bytes.data() + got, e->size - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      got += static_cast<size_t>(n);
    }
    // Truncated or written while we read it: not one version's bytes.
    if (got != e->size || e->changed_on_disk())
      return Status::unavailable;
    e->in_memory = true;
    e->held = held_;
    *held_ += e->size;
    // Never read again: a deleted file's space is not kept by the cache.
    close(e->fd);
    e->fd = -1;
  } else {
    // Read on demand: its descriptor stays open with it, in the cache and
    // in every response that still reads it after it left. A client that
    // stalls responses of files cycled through the cache must not make
    // the worker hold one per response (accept() and upstream connects
    // would fail for want of descriptors).
    if (*fds_ >= max_descriptors()) {
      stats_.descriptors_refused += 1;
      descriptors_refused += 1;
      return Status::unavailable; // e closes it
    }
    e->fds = fds_;
    *fds_ += 1;
  }
  out = std::move(e);
  return Status::ok;
}

void FileCache::erase(Map::iterator it) {
  stats_.bytes -= it->second.entry->bytes.size();
  lru_.erase(it->second.lru);
  map_.erase(it);
  stats_.entries = map_.size();
}

void FileCache::make_room(size_t incoming_bytes) {
  while (!lru_.empty() && (map_.size() >= limits_.max_entries ||
                           stats_.bytes + incoming_bytes > limits_.max_bytes)) {
    erase(map_.find(lru_.back()->first));
    stats_.evictions += 1;
  }
}

void FileCache::insert(const std::string &rel, std::shared_ptr<const FileEntry> entry,
                       uint64_t now_ns) {
  if (limits_.max_entries == 0)
    return;
  make_room(entry->bytes.size());
  auto [it, inserted] = map_.try_emplace(rel);
  it->second.entry = std::move(entry);
  it->second.checked_ns = now_ns;
  lru_.push_front(&*it);
  it->second.lru = lru_.begin();
  stats_.bytes += it->second.entry->bytes.size();
  stats_.entries = map_.size();
}

FileCache::Status FileCache::lookup(const std::string &rel, uint64_t now_ns,
                                    std::shared_ptr<const FileEntry> &out) {
  if (!limits_.allow_dotfiles && has_hidden_segment(rel))
    return Status::not_found;
  auto it = map_.find(rel);
  if (it != map_.end()) {
    Slot &slot = it->second;
    if (now_ns - slot.checked_ns < limits_.revalidate_ns && !slot.entry->stale) {
      stats_.hits += 1;
      lru_.splice(lru_.begin(), lru_, slot.lru);
      out = slot.entry;
      return Status::ok;
    }
    // Due for a check: the path may now name another file, or this one
    // may have changed.
    stats_.revalidations += 1;
    const FileEntry &old = *slot.entry;
    Looked l;
    Status st = look(rel, l);
    const bool same = st == Status::ok && l.st.st_ino == old.ino && l.st.st_dev == old.dev &&
                      static_cast<uint64_t>(l.st.st_size) == old.size &&
                      ns_of(l.st.st_mtim) == old.mtime_ns && ns_of(l.st.st_ctim) == old.ctime_ns;
    // A small file cached by its descriptor while evicted copies filled
    // memory goes back to memory once there is room again; an entry a
    // short read marked stale is replaced by a fresh one (it would be
    // checked again at every request otherwise).
    if (same && !old.stale && (old.in_memory || !fits_in_memory(old.size))) {
      stats_.hits += 1;
      slot.checked_ns = now_ns;
      lru_.splice(lru_.begin(), lru_, slot.lru);
      out = slot.entry;
      return Status::ok;
    }
    std::shared_ptr<const FileEntry> fresh;
    if (st == Status::ok) st = open_entry(l, fresh);
    if (st == Status::unavailable && !old.stale) {
      // Out of descriptors or memory, or the file is being rewritten: the
      // entry we hold is whole (in memory, or its own descriptor), so it
      // is served for another interval rather than turned into 503s.
      stats_.hits += 1;
      slot.checked_ns = now_ns;
      lru_.splice(lru_.begin(), lru_, slot.lru);
      out = slot.entry;
      return Status::ok;
    }
    if (st != Status::ok) {
      erase(it);
      return st;
    }
    if (!same) stats_.changed += 1;
    erase(it);
    insert(rel, fresh, now_ns);
    out = std::move(fresh);
    return Status::ok;
  }
  stats_.misses += 1;
  Looked l;
  Status st = look(rel, l);
  std::shared_ptr<const FileEntry> entry;
  if (st == Status::ok) st = open_entry(l, entry);
  if (st != Status::ok)
    return st;
  insert(rel, entry, now_ns);
  out = std::move(entry);
  return Status::ok;
}

void FileCache::sweep(uint64_t now_ns) {
  const uint64_t interval = std::max<uint64_t>(limits_.revalidate_ns, 1'000'000'000);
  if (swept_at_ != 0 && now_ns - swept_at_ < interval) return;
  swept_at_ = now_ns;
  // From where the last run stopped, else from the least recently used end
  // (which lookups revalidate least), towards the most recent.
  auto next = lru_.end();
  if (sweep_from_) {
    auto it = map_.find(*sweep_from_);
    if (it != map_.end()) next = std::next(it->second.lru);
    sweep_from_.reset();
  }
  size_t steps = 0, checks = 0;
  while (next != lru_.begin()) {
    auto cur = std::prev(next);
    if (steps == SWEEP_STEPS || checks == SWEEP_CHECKS) {
      sweep_from_ = (*cur)->first; // the next run starts here
      return;
    }
    steps += 1;
    const FileEntry &e = *(*cur)->second.entry;
    if (e.fd >= 0) {
      checks += 1;
      struct stat st {};
      // No name left: nobody can ask for this file again under its path.
      // Responses still reading it keep the entry (and its descriptor)
      // alive until they finish.
      if (fstat(e.fd, &st) == 0 && st.st_nlink == 0) {
        erase(map_.find((*cur)->first)); // `next` stays valid
        stats_.swept += 1;
        continue;
      }
    }
    next = cur;
  }
}

} // namespace xdpq::http

#pragma once
// A worker's open-file cache for the document root: path -> open
// descriptor, size, modification time, ETag and content type, and for small
// files the bytes themselves. A hit costs no system call; an entry is
// revalidated (openat2 O_PATH + fstat, nothing read unless it changed) at
// most every revalidate interval, so a file changed on disk is served
// fresh within that interval. Bounded by entries and by bytes held in
// memory, least recently used evicted.
//
// The path rules stay those of StaticFiles: openat2(RESOLVE_BENEATH) so no
// path or symlink leaves the root, regular files only (a FIFO or device is
// refused before it is opened: looked at through O_PATH), no dotfiles
// unless allowed (".well-known" always is).
//
// Entries are shared with the responses that use them (shared_ptr): an
// entry replaced or evicted stays alive until its last response finishes.
// One cache per worker thread; nothing here is locked.

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace xdpq::http {

struct FileCacheLimits {
  size_t max_entries = 4096;
  size_t max_bytes = 64u << 20;          // file contents held in memory, all entries
  size_t max_file_in_memory = 64u << 10; // larger files are read on demand
  uint64_t revalidate_ns = 1'000'000'000;
  // Descriptors of large files held beyond max_entries (by responses of
  // entries that left the cache, or of every file with the cache off), as
  // many again as max_entries and this many more.
  size_t extra_descriptors = 1024;
  bool allow_dotfiles = false;
};

struct FileEntry {
  FileEntry() = default;
  FileEntry(const FileEntry &) = delete;
  FileEntry &operator=(const FileEntry &) = delete;
  ~FileEntry();

  int fd = -1; // open, a regular file (closed once a small one is in memory)
  uint64_t size = 0;
  uint64_t ino = 0;
  uint64_t dev = 0;
  uint64_t mtime_ns = 0;
  // Changes with any write or metadata change, whatever the mtime says
  // (a copy that keeps the old mtime, a rewrite in place with touch -r).
  uint64_t ctime_ns = 0;
  uint64_t nlink = 0; // names it had when opened
  std::string etag; // strong: inode, size, mtime, ctime
  std::string_view content_type;
  std::string bytes; // the whole file when it is small; else empty
  bool in_memory = false;
  bool directory = false; // the path names a directory; this is its index.html
  // A read found the file shorter than this entry says, or changed: the
  // next lookup revalidates at once instead of waiting for the interval.
  mutable bool stale = false;
  // The open file is no longer what this entry describes (written in
  // place or truncated: its size, its mtime, or while its names are the
  // same its ctime changed): bytes read from it may belong to another
  // version. One fstat().
  bool changed_on_disk() const;
  // Its cache's count of file bytes in memory, which bytes are part of
  // while this entry lives (null when they are not in memory).
  std::shared_ptr<size_t> held;
  // Its cache's count of open descriptors, which fd is one of while it is
  // open (null when it is not: a small file's is closed once read).
  std::shared_ptr<size_t> fds;
};

struct FileCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t revalidations = 0; // stat checks of a cached entry
  uint64_t changed = 0;       // entries found changed on disk and reloaded
  uint64_t evictions = 0;
  uint64_t swept = 0; // entries of deleted files let go by sweep()
  uint64_t descriptors_refused = 0; // large files not opened: max_descriptors() held
  size_t entries = 0;
  size_t bytes = 0;
};

class FileCache {
public:
  enum class Status { ok, not_found, forbidden, unavailable };

  // root_fd: an O_PATH descriptor of the document root (not owned).
  FileCache(int root_fd, const FileCacheLimits &limits);
  FileCache(const FileCache &) = delete;
  FileCache &operator=(const FileCache &) = delete;

  // rel: a normalised path under the root ("" for the root). A directory
  // means its index.html. now_ns: the caller's monotonic clock.
  Status lookup(const std::string &rel, uint64_t now_ns, std::shared_ptr<const FileEntry> &out);

  // Lets go of files deleted from the docroot (or replaced by a rename)
  // whose paths nobody asks for any more: a large file's entry holds its
  // descriptor, and with it the file's disk space, until a lookup of its
  // path sees the change. Runs at most once per revalidate interval (and
  // at most once a second); each run goes on where the last one stopped,
  // through at most SWEEP_STEPS entries and SWEEP_CHECKS descriptors (one
  // fstat each), so every entry is reached within entries / SWEEP_STEPS
  // runs, however many there are.
  void sweep(uint64_t now_ns);
  static constexpr size_t SWEEP_CHECKS = 256;
  static constexpr size_t SWEEP_STEPS = 1024;

  const FileCacheStats &stats() const { return stats_; }
  // File contents in memory, cached or not: an entry evicted or replaced
  // lives on while responses still send it. Those outside the cache are
  // held to max_bytes too (a file that would pass it is read on demand
  // instead), so all of it stays within twice max_bytes.
  size_t bytes_held() const { return *held_; }
  // Descriptors of large files held, cached or not (a response keeps its
  // entry's open after it left the cache). Held to max_descriptors():
  // past it, a large file not cached is unavailable (503).
  size_t descriptors_held() const { return *fds_; }
  size_t max_descriptors() const { return 2 * limits_.max_entries + limits_.extra_descriptors; }

private:
  struct Slot;
  using Map = std::unordered_map<std::string, Slot>;
  struct Slot {
    std::shared_ptr<const FileEntry> entry;
    uint64_t checked_ns = 0;
    std::list<Map::value_type *>::iterator lru;
  };
  // A path resolved to the regular file it serves (a directory's
  // index.html), without opening it.
  struct Looked {
    struct stat st;
    bool directory;
    std::string path; // beneath the root
  };
  Status look(const std::string &rel, Looked &l) const;
  bool fits_in_memory(uint64_t size) const;
  Status open_entry(const Looked &l, std::shared_ptr<const FileEntry> &out);
  void insert(const std::string &rel, std::shared_ptr<const FileEntry> entry, uint64_t now_ns);
  void erase(Map::iterator it);
  void make_room(size_t incoming_bytes);

  int root_fd_;
  FileCacheLimits limits_;
  Map map_;
  // front: most recently used. Elements of map_ keep their addresses
  // through rehashing, so the list points at them.
  std::list<Map::value_type *> lru_;
  std::shared_ptr<size_t> held_ = std::make_shared<size_t>(0);
  std::shared_ptr<size_t> fds_ = std::make_shared<size_t>(0);
  uint64_t swept_at_ = 0;
  std::optional<std::string> sweep_from_; // the key the next sweep() starts at
  FileCacheStats stats_;
};

// Large files this thread's caches refused to open for their bound of
// descriptors (FileCache::max_descriptors()), since the thread began.
uint64_t file_descriptors_refused();

// True when a path segment starts with '.' (other than ".well-known").
bool has_hidden_segment(std::string_view rel);

// rel ("" for the directory itself) opened read-only and non-blocking,
// never resolving outside dirfd (openat2 RESOLVE_BENEATH); -1 and errno.
int open_beneath(int dirfd, const char *rel);

} // namespace xdpq::http

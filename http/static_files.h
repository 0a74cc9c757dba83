#pragma once
// Static files under a document root: content type, Content-Length, strong
// ETag with If-None-Match, HEAD, one byte range, all answered from the
// worker's open-file cache (file_cache.h). The target path is decoded and
// checked segment by segment, and files are opened with openat2()
// RESOLVE_BENEATH, so neither ".." nor a symlink can leave the root; only
// regular files are served, dotfiles only when allowed. Small files are
// served from memory, large ones read on demand (never mapped: a file
// truncated while it is being served ends that response, nothing else).

#include "http/file_cache.h"
#include "http/router.h"

namespace xdpq::http {

class StaticFiles final : public Handler {
public:
  // docroot empty: serve the embedded demo page at "/" and "/index.html".
  // Throws std::runtime_error if docroot is not an openable directory.
  explicit StaticFiles(const std::string &docroot, const FileCacheLimits &limits = {});
  ~StaticFiles() override;
  StaticFiles(const StaticFiles &) = delete;
  StaticFiles &operator=(const StaticFiles &) = delete;

  void handle(const Request &req, Response &resp) const override;

  // This worker thread's cache (tests, counters).
  FileCache &cache() const;

private:
  void serve_embedded(Response &resp, std::string_view rel, bool names_directory) const;
  int root_fd_ = -1;
  uint64_t id_ = 0;
  FileCacheLimits limits_;
};

// Decodes %XX and normalises target into a path relative to the root
// ("" for the root itself). Returns false for a path that is malformed or
// tries to climb out (".." segments, NUL bytes, bad escapes). When
// names_directory is given, it says whether the decoded path ends in a
// slash or "/." (escaped or not): such a path can name no file.
bool normalize_path(std::string_view target, std::string &out, bool *names_directory = nullptr);

std::string_view content_type_for(std::string_view path);

// Parses a single "bytes=" range against size. Returns 0 when the header
// should be ignored (multiple ranges, other units, garbage), 1 on success
// with [first, last] filled, -1 when the range is unsatisfiable.
int parse_range(std::string_view header, uint64_t size, uint64_t &first, uint64_t &last);

// Runs FileCache::sweep() on this thread's caches (from the worker's
// heartbeat): deleted files' descriptors are closed even when their paths
// are never asked for again.
void sweep_file_caches(uint64_t now_ns);

// Bytes of large files read into memory by this thread and not yet
// released by the transports (sent and acknowledged, or copied).
uint64_t file_read_bytes_held();

} // namespace xdpq::http

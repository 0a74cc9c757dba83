#include "base/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace xdpq {

std::string private_file_problem(const struct stat &st, bool allow_root, bool any_owner) {
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (!any_owner && st.st_uid != geteuid() && !(allow_root && st.st_uid == 0)) {
    return "owned by uid " + std::to_string(st.st_uid) + ", not by us";
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("has mode ") + mode + "; it must be private (chmod 600, or remove it)";
  }
  return "";
}

int open_private_output(const std::string &path, bool truncate, std::string *why,
                        std::span<const std::string_view> starts, std::string_view kind) {
  // No O_TRUNC yet: a file we refuse below must be left as it was. Read
  // too: what an existing file begins with is checked on this descriptor.
  int fd = open(
      path.c_str(),
      O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (truncate ? 0 : O_APPEND), 0600);
  if (fd < 0) {
    *why = path + ": " + (errno == ELOOP ? "is a symbolic link (refused)" : std::strerror(errno));
    return -1;
  }
  struct stat st {};
  std::string problem;
  if (fstat(fd, &st) != 0) {
    problem = std::strerror(errno);
  } else {
    problem = private_file_problem(st, false);
    // A second name for some other file of ours (a key), linked here by
    // someone who may write to this directory but not read that file.
    if (problem.empty() && st.st_nlink > 1) {
      problem = "has " + std::to_string(st.st_nlink) +
                " hard links; refused (it may be another file under a second name)";
    }
  }
  if (problem.empty() && !starts.empty() && st.st_size > 0) {
    char head[32] = {};
    const ssize_t got = pread(fd, head, sizeof(head), 0);
    const std::string_view have(head, got > 0 ? static_cast<size_t>(got) : 0);
    bool known = false;
    for (auto start : starts) known = known || have.starts_with(start);
    if (!known) {
      problem = "exists and is not " + std::string(kind) +
                "; refused (remove it or name another file)";
    }
  }
  if (problem.empty() && truncate && ftruncate(fd, 0) != 0) problem = std::strerror(errno);
  if (!problem.empty()) {
    close(fd);
    *why = path + ": " + problem;
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

} // namespace xdpq

#pragma once
// Files that hold secrets or traffic (TLS key logs, packet captures): opened
// without following a symlink (O_NOFOLLOW: nobody can point the daemon's
// write at /etc/shadow), created 0600, and an existing file is accepted only
// when it is a regular file owned by us and private (no group/other bits).

#include <sys/stat.h>

#include <string>

namespace xdpq {

// Opens path for writing (appending, or truncated once accepted). Returns
// the descriptor, or -1 with the reason in *why.
int open_private_output(const std::string &path, bool truncate, std::string *why);

// What is wrong with a file that holds secrets, from its fstat: not a
// regular file, owned by someone else (root too when allow_root), or
// readable by group or others. Empty when it is fine.
std::string private_file_problem(const struct stat &st, bool allow_root);

} // namespace xdpq

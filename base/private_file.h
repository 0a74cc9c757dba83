#pragma once
// Files that hold secrets or traffic (TLS key logs, packet captures): opened
// without following a symlink (O_NOFOLLOW: nobody can point the daemon's
// write at /etc/shadow), created 0600, and an existing file is accepted only
// when it is a regular file owned by us and private (no group/other bits).

#include <sys/stat.h>

#include <span>
#include <string>
#include <string_view>

namespace xdpq {

// Opens path for writing (appending, or truncated once accepted). Returns
// the descriptor, or -1 with the reason in *why. With starts given, an
// existing file that is not empty must begin with one of them: a capture
// or key log overwrites or extends only its own kind, never another file
// of ours (the QUIC secrets file, a key, a log) named by mistake; kind
// names what was expected in the refusal.
int open_private_output(const std::string &path, bool truncate, std::string *why,
                        std::span<const std::string_view> starts = {},
                        std::string_view kind = {});

// What is wrong with a file that holds secrets, from its fstat: not a
// regular file, owned by someone else (root too when allow_root; anyone
// when any_owner), or readable by group or others. Empty when it is fine.
std::string private_file_problem(const struct stat &st, bool allow_root, bool any_owner = false);

} // namespace xdpq

#pragma once
// The subset of TOML that xdpqd's configuration uses, parsed strictly:
// [section] headers, key = value lines, values that are strings (basic
// "..." with escapes, or literal '...'), integers, booleans, or arrays of
// those (across lines, trailing comma allowed), and # comments. Anything
// else (dotted keys, nested or array tables, floats, dates, inline tables,
// multi-line strings) is an error naming the line and column, not a guess.
//
// Written here rather than taken from a general TOML library: the one in
// Debian 12 (toml11 3.7) overflows a heap buffer on a 4-byte file, and a
// configuration parser is a place for exactly the rules we need.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xdpq::control {

struct TomlValue {
  enum class Type { string, integer, boolean, array };
  Type type = Type::string;
  std::string str;
  int64_t integer = 0;
  bool boolean = false;
  std::vector<TomlValue> array;
  int line = 0; // where the value starts
};

struct TomlEntry {
  std::string section; // "" for keys before any [section]
  std::string key;
  TomlValue value;
  int line = 0;
};

// One [section] header, for "unknown section" messages.
struct TomlSection {
  std::string name;
  int line = 0;
};

struct TomlDocument {
  std::vector<TomlSection> sections;
  std::vector<TomlEntry> entries; // in file order
};

class TomlError : public std::runtime_error {
public:
  TomlError(int line, int column, const std::string &what)
      : std::runtime_error("line " + std::to_string(line) + ", column " + std::to_string(column) +
                           ": " + what),
        line_(line) {}
  int line() const { return line_; }

private:
  int line_;
};

// Parses a whole file's text. Throws TomlError.
TomlDocument parse_toml(std::string_view text);

} // namespace xdpq::control

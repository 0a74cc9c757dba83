#include "control/toml_lite.h"

#include <limits>

namespace xdpq::control {

namespace {

class Parser {
public:
  explicit Parser(std::string_view text) : s_(text) {}

  TomlDocument run() {
    TomlDocument doc;
    std::string section;
    while (true) {
      skip_blanks();
      if (eof())
        break;
      char c = peek();
      if (c == '#') {
        skip_comment();
      } else if (c == '\n' || c == '\r') {
        newline();
      } else if (c == '[') {
        section = header(doc);
      } else {
        doc.entries.push_back(key_value(section, doc));
      }
    }
    return doc;
  }

private:
  [[noreturn]] void fail(const std::string &what) const {
    throw TomlError(line_, static_cast<int>(i_ - line_start_) + 1, what);
  }
  bool eof() const { return i_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return i_ + ahead < s_.size() ? s_[i_ + ahead] : '\0'; }
  void skip_blanks() {
    while (!eof() && (peek() == ' ' || peek() == '\t'))
      ++i_;
  }
  void skip_comment() {
    ++i_; // '#'
    while (!eof() && peek() != '\n') {
      if (peek() == '\r' && peek(1) == '\n')
        break;
      check_text_char();
    }
  }
  // The end of a line: "\n", "\r\n" or the end of the file.
  void newline() {
    if (eof())
      return;
    if (peek() == '\r' && peek(1) == '\n')
      ++i_;
    if (peek() != '\n')
      fail("expected the end of the line");
    ++i_;
    ++line_;
    line_start_ = i_;
  }
  // What may follow a value or header on its line: blanks, a comment.
  void end_of_line() {
    skip_blanks();
    if (peek() == '#')
      skip_comment();
    if (!eof())
      newline();
  }
  // One character of text in a string or comment: no control characters,
  // valid UTF-8. Appends it to out when given.
  void check_text_char(std::string *out = nullptr) {
    unsigned char c = static_cast<unsigned char>(peek());
    if (c < 0x20 ? c != '\t' : c == 0x7f)
      fail("control character in text");
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || (n > 1 && c < 0xc2) || (c > 0xf4))
      fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = static_cast<unsigned char>(peek(k));
      if ((d >> 6) != 0x2)
        fail("invalid UTF-8");
      cp = cp << 6 | (d & 0x3f);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
      fail("invalid UTF-8");
    }
    if (out)
      out->append(s_.substr(i_, n));
    i_ += n;
  }

  std::string bare_key() {
    size_t start = i_;
    while (!eof()) {
      char c = peek();
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-';
      if (!ok)
        break;
      ++i_;
    }
    if (i_ == start) {
      if (peek() == '"' || peek() == '\'')
        fail("quoted keys are not supported here");
      fail("expected a key (letters, digits, '_' or '-')");
    }
    return std::string(s_.substr(start, i_ - start));
  }

  std::string header(TomlDocument &doc) {
    int line = line_;
    ++i_; // '['
    if (peek() == '[')
      fail("arrays of tables are not supported here");
    skip_blanks();
    std::string name = bare_key();
    skip_blanks();
    if (peek() == '.')
      fail("nested tables are not supported here");
    if (peek() != ']')
      fail("expected ']'");
    ++i_;
    for (const auto &sec : doc.sections) {
      if (sec.name == name) {
        fail("section [" + name + "] defined twice (first at line " + std::to_string(sec.line) +
             ")");
      }
    }
    doc.sections.push_back(TomlSection{name, line});
    end_of_line();
    return name;
  }

  TomlEntry key_value(const std::string &section, const TomlDocument &doc) {
    TomlEntry e;
    e.section = section;
    e.line = line_;
    e.key = bare_key();
    skip_blanks();
    if (peek() == '.')
      fail("dotted keys are not supported here");
    if (peek() != '=')
      fail("expected '=' after the key");
    ++i_;
    skip_blanks();
    for (const auto &o : doc.entries) {
      if (o.section == section && o.key == e.key) {
        fail("key " + e.key + " defined twice (first at line " + std::to_string(o.line) + ")");
      }
    }
    e.value = value(true);
    end_of_line();
    return e;
  }

  TomlValue value(bool array_allowed) {
    TomlValue v;
    v.line = line_;
    char c = peek();
    if (c == '"') {
      v.type = TomlValue::Type::string;
      v.str = basic_string();
    } else if (c == '\'') {
      v.type = TomlValue::Type::string;
      v.str = literal_string();
    } else if (c == '[') {
      if (!array_allowed)
        fail("nested arrays are not supported here");
      v.type = TomlValue::Type::array;
      array(v.array);
    } else if (c == 't' || c == 'f') {
      v.type = TomlValue::Type::boolean;
      std::string_view word = c == 't' ? "true" : "false";
      if (s_.substr(i_, word.size()) != word)
        fail("expected true or false");
      i_ += word.size();
      v.boolean = c == 't';
      check_value_end();
    } else if ((c >= '0' && c <= '9') || c == '+' || c == '-') {
      v.type = TomlValue::Type::integer;
      v.integer = integer();
    } else if (c == '{') {
      fail("inline tables are not supported here");
    } else {
      fail("expected a value (a string, an integer, true/false or an array)");
    }
    return v;
  }

  // After a bare value: a delimiter must follow.
  void check_value_end() {
    char c = peek();
    if (!(eof() || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '#' || c == ',' ||
          c == ']')) {
      fail("unexpected character after the value");
    }
  }

  int64_t integer() {
    bool neg = false;
    if (peek() == '+' || peek() == '-') {
      neg = peek() == '-';
      ++i_;
    }
    if (!(peek() >= '0' && peek() <= '9'))
      fail("expected digits");
    if (peek() == '0' && peek(1) >= '0' && peek(1) <= '9')
      fail("leading zeros are not allowed");
    if (peek() == '0' && (peek(1) == 'x' || peek(1) == 'o' || peek(1) == 'b')) {
      fail("only decimal integers are supported here");
    }
    uint64_t limit = neg ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
    uint64_t acc = 0;
    bool last_digit = false;
    while (!eof()) {
      char c = peek();
      if (c >= '0' && c <= '9') {
        uint64_t d = static_cast<uint64_t>(c - '0');
        if (acc > (limit - d) / 10)
          fail("integer out of range");
        acc = acc * 10 + d;
        last_digit = true;
      } else if (c == '_' && last_digit && peek(1) >= '0' && peek(1) <= '9') {
        last_digit = false;
      } else {
        break;
      }
      ++i_;
    }
    char c = peek();
    if (c == '.' || c == 'e' || c == 'E')
      fail("floats are not supported here");
    if (c == ':' || c == '-' || c == 'T')
      fail("dates and times are not supported here");
    check_value_end();
    if (neg)
      return acc == (uint64_t{1} << 63) ? std::numeric_limits<int64_t>::min()
                                        : -static_cast<int64_t>(acc);
    return static_cast<int64_t>(acc);
  }

  std::string literal_string() {
    if (peek(1) == '\'' && peek(2) == '\'')
      fail("multi-line strings are not supported here");
    ++i_;
    std::string out;
    while (true) {
      if (eof() || peek() == '\n' || peek() == '\r')
        fail("unterminated string");
      if (peek() == '\'')
        break;
      check_text_char(&out);
    }
    ++i_;
    check_value_end();
    return out;
  }

  std::string basic_string() {
    if (peek(1) == '"' && peek(2) == '"')
      fail("multi-line strings are not supported here");
    ++i_;
    std::string out;
    while (true) {
      if (eof() || peek() == '\n' || peek() == '\r')
        fail("unterminated string");
      char c = peek();
      if (c == '"')
        break;
      if (c != '\\') {
        check_text_char(&out);
        continue;
      }
      ++i_;
      char e = peek();
      ++i_;
      switch (e) {
      case 'b':
        out += '\b';
        break;
      case 't':
        out += '\t';
        break;
      case 'n':
        out += '\n';
        break;
      case 'f':
        out += '\f';
        break;
      case 'r':
        out += '\r';
        break;
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case 'u':
        unicode_escape(4, out);
        break;
      case 'U':
        unicode_escape(8, out);
        break;
      default:
        --i_;
        fail("unknown escape sequence");
      }
    }
    ++i_;
    check_value_end();
    return out;
  }

  void unicode_escape(int digits, std::string &out) {
    uint32_t cp = 0;
    for (int k = 0; k < digits; ++k) {
      char c = peek();
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0)
        fail("expected hex digits in a \\u escape");
      cp = cp << 4 | static_cast<uint32_t>(d);
      ++i_;
    }
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      fail("escape is not a Unicode scalar");
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | cp >> 6);
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | cp >> 12);
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | cp >> 18);
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  // Blanks, newlines and comments between array items.
  void skip_array_space() {
    while (!eof()) {
      char c = peek();
      if (c == ' ' || c == '\t') {
        ++i_;
      } else if (c == '#') {
        skip_comment();
      } else if (c == '\n' || c == '\r') {
        newline();
      } else {
        break;
      }
    }
  }

  void array(std::vector<TomlValue> &items) {
    ++i_; // '['
    while (true) {
      skip_array_space();
      if (eof())
        fail("unterminated array");
      if (peek() == ']')
        break;
      items.push_back(value(false));
      if (items.size() > 4096)
        fail("array too long");
      skip_array_space();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != ']')
        fail("expected ',' or ']' in the array");
    }
    ++i_;
    check_value_end();
  }

  std::string_view s_;
  size_t i_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
};

} // namespace

TomlDocument parse_toml(std::string_view text) {
  return Parser(text).run();
}

} // namespace xdpq::control

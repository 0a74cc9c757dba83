#include "http/response_head.h"

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace xdpq::http {

std::string_view http_date_now() {
  thread_local time_t second = -1;
  thread_local char text[32];
  timespec now{};
  clock_gettime(CLOCK_REALTIME_COARSE, &now);
  if (now.tv_sec != second) {
    static constexpr const char *DAYS[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static constexpr const char *MONTHS[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                             "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    tm t{};
    gmtime_r(&now.tv_sec, &t);
    std::snprintf(text, sizeof(text), "%s, %02d %s %04d %02d:%02d:%02d GMT", DAYS[t.tm_wday % 7],
                  t.tm_mday, MONTHS[t.tm_mon % 12], t.tm_year + 1900, t.tm_hour, t.tm_min,
                  t.tm_sec);
    second = now.tv_sec;
  }
  return {text, 29};
}

void ResponseHead::build(const Response &resp, std::string_view alt_svc) {
  code_ = resp.status >= 100 && resp.status <= 999 ? resp.status : 500;
  std::to_chars(status_, status_ + 3, code_);
  status_[3] = '\0';
  fields_.clear();
  bool own_server = true;
  if (extra_) {
    for (const auto &h : *extra_) own_server &= h.name != "server";
  }
  if (own_server) fields_.push_back({"server", "xdpq"});
  if (!resp.headers.find("date")) fields_.push_back({"date", http_date_now(), true});
  if (code_ != 304 && code_ != 204 && !resp.length_unknown) {
    auto [end, ec] = std::to_chars(content_length_, content_length_ + sizeof(content_length_),
                                   resp.content_length);
    (void)ec;
    fields_.push_back(
        {"content-length",
         std::string_view(content_length_, static_cast<size_t>(end - content_length_)), true});
  }
  if (!alt_svc.empty())
    fields_.push_back({"alt-svc", alt_svc});
  for (const auto &h : resp.headers)
    fields_.push_back({h.name, h.value});
  if (extra_) {
    for (const auto &h : *extra_) {
      if (!resp.headers.find(h.name)) fields_.push_back({h.name, h.value});
    }
  }
}

std::string parse_response_field(std::string_view line, Header &out) {
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return "expected \"Name: value\"";
  std::string name(line.substr(0, colon));
  for (char &c : name) {
    const auto u = static_cast<unsigned char>(c);
    // RFC 9110 5.6.2 tchar
    const bool tchar =
        u != 0 && (std::isalnum(u) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr);
    if (!tchar || u >= 0x80) return "the name \"" + name + "\" is not a token";
    c = static_cast<char>(std::tolower(u));
  }
  std::string_view v = line.substr(colon + 1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  for (char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f)
      return "the value of " + name + " has a control character";
  }
  static constexpr std::string_view OWNED[] = {
      "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection",
      "upgrade",        "te",                "trailer",    "date",       "alt-svc",
      "content-type",   "content-range",     "etag",       "last-modified",
      "accept-ranges",  "content-encoding",  "location"};
  for (auto o : OWNED) {
    if (name == o) return name + " is set by the server per response, not configurable";
  }
  out.name = std::move(name);
  out.value = std::string(v);
  return {};
}

void ResponseHead::append_http1(std::string &out, bool close) const {
  out += "HTTP/1.1 ";
  out.append(status_, 3);
  out += ' ';
  out += reason_phrase(code_);
  out += "\r\n";
  for (const auto &f : fields_) {
    out += f.name;
    out += ": ";
    out += f.value;
    out += "\r\n";
  }
  if (close)
    out += "connection: close\r\n";
  out += "\r\n";
}

} // namespace xdpq::http

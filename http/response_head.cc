#include "http/response_head.h"

#include <charconv>
#include <cstdio>
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
  fields_.push_back({"server", "xdpq"});
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

#pragma once
// The response head, decided once for every protocol: :status, server,
// date, content-length (not for 204 and 304), alt-svc where the transport
// advertises one (the TCP side), then the handler's headers, then the
// operator's configured fields that the response does not have already. HTTP/3 and
// HTTP/2 turn the fields into their name/value arrays, HTTP/1.1 writes them
// out as text; none of them spells the rule again.
//
// Reused across responses: build() allocates nothing once its field array
// has grown to the largest response's size. Fields point into the Response
// and into the builder; they are valid until the next build().

#include "http/message.h"

#include <span>
#include <string_view>
#include <vector>

namespace xdpq::http {

struct HeadField {
  std::string_view name;  // lower case; a literal or in the Response
  std::string_view value;
  // The value is in the builder (content-length), valid only until the
  // next build(); every other value lives as long as the Response.
  bool value_in_builder = false;
};

// The current time as an HTTP date ("Fri, 27 Nov 2026 08:05:42 GMT", RFC
// 9110 5.6.7), formatted once a second per thread; valid until the next
// call on this thread in another second.
std::string_view http_date_now();

// One configured response field, "Name: value" (response_headers): the
// name a token, lower-cased; the value visible characters, spaces and tabs,
// trimmed. Fields the server owns (framing, validators, content type, Date,
// Alt-Svc, connection-specific ones) are refused. Returns the reason, or
// empty when out is filled.
std::string parse_response_field(std::string_view line, Header &out);

class ResponseHead {
public:
  // Fields added to every response that lacks them (not owned: they live
  // as long as the configuration). A "server" among them replaces ours.
  void set_extra(const std::vector<Header> *extra) { extra_ = extra; }

  // Adds date (RFC 9110 6.6.1) unless the Response has one (a proxied
  // upstream's).
  void build(const Response &resp, std::string_view alt_svc = {});

  std::string_view status() const { return {status_, 3}; }
  // Without the status (HTTP/3 and HTTP/2 add it as a pseudo-header).
  std::span<const HeadField> fields() const { return fields_; }

  // HTTP/1.1: the status line and the fields, appended to out.
  void append_http1(std::string &out, bool close) const;

private:
  char status_[4] = {};
  char content_length_[24] = {};
  int code_ = 0;
  std::vector<HeadField> fields_;
  const std::vector<Header> *extra_ = nullptr;
};

} // namespace xdpq::http

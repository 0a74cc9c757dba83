#include "http/handlers.h"

#include <charconv>

namespace xdpq::http {

bool allow_get_head(const Request &req, Response &resp) {
  if (req.method == "GET" || req.method == "HEAD") {
    return true;
  }
  make_error(resp, 405);
  resp.add_header("allow", "GET, HEAD");
  return false;
}

void HealthHandler::handle(const Request &req, Response &resp) const {
  if (!allow_get_head(req, resp)) {
    return;
  }
  resp.set(200, "text/plain", std::make_unique<StaticBody>("ok\n"));
  resp.add_header("cache-control", "no-store");
}

void EchoHandler::handle(const Request &req, Response &resp) const {
  if (req.method != "POST" && req.method != "PUT") {
    make_error(resp, 405);
    resp.add_header("allow", "POST, PUT");
    return;
  }
  const std::string *ct = req.find("content-type");
  resp.set(200, ct ? std::string_view(*ct) : "application/octet-stream",
           std::make_unique<MemoryBody>(std::move(req.body)));
}

void BytesHandler::handle(const Request &req, Response &resp) const {
  if (!allow_get_head(req, resp)) {
    return;
  }
  auto path = path_only(req.path);
  constexpr std::string_view PREFIX = "/bytes/";
  auto digits = path.starts_with(PREFIX) ? path.substr(PREFIX.size()) : std::string_view{};
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size()) {
    make_error(resp, 400);
    return;
  }
  if (n > max_) {
    make_error(resp, 413);
    return;
  }
  resp.set(200, "application/octet-stream", std::make_unique<PatternBody>(n));
}

} // namespace xdpq::http

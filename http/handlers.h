#pragma once
// Built-in handlers present on every protocol.

#include "http/router.h"

namespace xdpq::http {

// GET/HEAD /healthz: 200 "ok".
class HealthHandler final : public Handler {
public:
  void handle(const Request &req, Response &resp) const override;
};

// POST/PUT /echo: the request body back, with the request's content-type.
class EchoHandler final : public Handler {
public:
  void handle(const Request &req, Response &resp) const override;
  bool takes_body() const override { return true; }
};

// GET/HEAD /bytes/N: N bytes of PatternBody (decimal N, 0..max).
class BytesHandler final : public Handler {
public:
  explicit BytesHandler(uint64_t max) : max_(max) {}
  void handle(const Request &req, Response &resp) const override;

private:
  uint64_t max_;
};

// True for GET and HEAD; otherwise fills a 405 with Allow.
bool allow_get_head(const Request &req, Response &resp);

} // namespace xdpq::http

#pragma once
// Routes a protocol-neutral Request to a handler. Shared by HTTP/3 and the
// TCP side, so a URL returns the same bytes on every protocol.

#include "http/file_cache.h"
#include "http/message.h"

#include <memory>
#include <string>
#include <vector>

namespace xdpq::http {

class Handler {
public:
  virtual ~Handler() = default;
  // Fills resp. Handlers may ignore HEAD: the router strips the body.
  virtual void handle(const Request &req, Response &resp) const = 0;
  // Reads the request's body: the session collects it before handle().
  // Others are answered as soon as the head is there, and a body sent
  // with their request is never held.
  virtual bool takes_body() const { return false; }
};

class Router {
public:
  // Exact match on the path without its query.
  void add_exact(std::string path, std::shared_ptr<const Handler> h);
  // Longest registered prefix wins.
  void add_prefix(std::string prefix, std::shared_ptr<const Handler> h);
  void set_fallback(std::shared_ptr<const Handler> h);

  // Never throws; unknown paths without a fallback get 404.
  void route(const Request &req, Response &resp) const;
  // Whether the handler req goes to reads its body (POST /echo does).
  bool takes_body(const Request &req) const;

private:
  const Handler *find(std::string_view path) const;
  struct Route {
    std::string path;
    bool prefix;
    std::shared_ptr<const Handler> handler;
  };
  std::vector<Route> routes_;
  std::shared_ptr<const Handler> fallback_;
};

struct RouterConfig {
  std::string docroot;          // empty: the embedded demo page
  uint64_t max_bytes = 64ull << 20; // largest /bytes/N
  FileCacheLimits files;            // the workers' open-file caches
  bool test_routes = true;          // /echo and /bytes/N
};

// The standard route table: /healthz, /echo and /bytes/N (test_routes),
// then static files.
// Throws std::runtime_error if the document root cannot be opened.
std::shared_ptr<const Router> make_default_router(const RouterConfig &cfg);

// Path without query or fragment.
std::string_view path_only(std::string_view target);

} // namespace xdpq::http

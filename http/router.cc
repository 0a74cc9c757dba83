#include "http/router.h"

#include "http/handlers.h"
#include "http/static_files.h"

namespace xdpq::http {

std::string_view path_only(std::string_view target) {
  auto q = target.find_first_of("?#");
  return q == std::string_view::npos ? target : target.substr(0, q);
}

void Router::add_exact(std::string path, std::shared_ptr<const Handler> h) {
  routes_.push_back(Route{std::move(path), false, std::move(h)});
}

void Router::add_prefix(std::string prefix, std::shared_ptr<const Handler> h) {
  routes_.push_back(Route{std::move(prefix), true, std::move(h)});
}

void Router::set_fallback(std::shared_ptr<const Handler> h) { fallback_ = std::move(h); }

const Handler *Router::find(std::string_view path) const {
  const Handler *best = nullptr;
  size_t best_len = 0;
  for (const auto &r : routes_) {
    if (r.prefix) {
      if (path.starts_with(r.path) && r.path.size() >= best_len) {
        best = r.handler.get();
        best_len = r.path.size();
      }
    } else if (path == r.path) {
      return r.handler.get();
    }
  }
  return best ? best : fallback_.get();
}

bool Router::takes_body(const Request &req) const {
  const Handler *h = find(path_only(req.path));
  return h && h->takes_body();
}

void Router::route(const Request &req, Response &resp) const {
  resp.reset();
  // HTTP/1.x checked its Host already; an HTTP/2 or HTTP/3 :authority that
  // is not a host and port (userinfo, a path) names nothing served here,
  // nor does a Host field that stands in for a missing :authority.
  const std::string *host = req.authority.empty() ? req.find("host") : &req.authority;
  if (host && !host->empty() && !valid_host_field(*host)) {
    make_error(resp, 400, req.method == "HEAD");
    return;
  }
  const Handler *best = find(path_only(req.path));
  if (!best) {
    make_error(resp, 404);
  } else {
    try {
      best->handle(req, resp);
    } catch (...) {
      // A handler that failed (out of memory, most likely): a 500 without
      // a body, built without allocating.
      resp.headers.clear();
      resp.body.reset();
      resp.status = 500;
      resp.content_length = 0;
    }
  }
  // HEAD: same headers and Content-Length as GET, no body.
  if (req.method == "HEAD") {
    resp.body.reset();
  }
}

std::shared_ptr<const Router> make_default_router(const RouterConfig &cfg) {
  auto r = std::make_shared<Router>();
  r->add_exact("/healthz", std::make_shared<HealthHandler>());
  if (cfg.test_routes) {
    r->add_exact("/echo", std::make_shared<EchoHandler>());
    r->add_prefix("/bytes/", std::make_shared<BytesHandler>(cfg.max_bytes));
  }
  r->set_fallback(std::make_shared<StaticFiles>(cfg.docroot, cfg.files));
  return r;
}

} // namespace xdpq::http

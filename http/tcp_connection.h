#pragma once
// One TCP connection of the TCP side: the socket, TLS (OpenSSL), the
// protocol session chosen by ALPN (HTTP/2 or HTTP/1.1), the output buffer
// and the deadlines (handshake, request headers, stalled output, idle). It
// lives in its worker's event loop; TcpServer owns it and frees it at the
// end of the pass in which it finished.

#include "dataplane/event_loop.h"
#include "http/tcp_session.h"

#include <cstdint>
#include <memory>

namespace xdpq::http {

class TcpServer;
struct TcpConnInfo;

class TcpConnection : public dataplane::FdHandler {
public:
  virtual ~TcpConnection() = default;
  virtual TcpConnInfo info() const = 0;
  // Requests in flight or output pending (a drain waits for these).
  virtual bool busy() const = 0;
  // Graceful: GOAWAY / "connection: close" after the current response.
  virtual void shutdown() = 0;
  // The session asked to be woken (TcpServer::end_of_pass): run it again.
  virtual void resume() = 0;
};

// A connection accepted on fd (non-blocking) from peer, TLS or cleartext,
// holding its source's slot in the server's per-source limiter.
std::unique_ptr<TcpConnection> make_tcp_connection(TcpServer &srv, int fd, bool tls,
                                                   uint32_t source_slot,
                                                   const dataplane::Address &peer);

} // namespace xdpq::http

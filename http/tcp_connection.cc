#include "http/tcp_connection.h"

#include "http/tcp_server.h"

#include <netinet/in.h>
#include <openssl/err.h>
#include <sys/epoll.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace xdpq::http {

namespace {

constexpr size_t READ_CHUNK = 16 * 1024;
constexpr size_t READ_BUDGET = 256 * 1024; // per readiness event, for fairness
// ... and reads (one TLS record each): a client sending one-byte records
// would otherwise have the worker decrypt and parse 256 Ki of them, one at
// a time, before anyone else is served. 64 full records are 1 MiB.
constexpr int READS_PER_EVENT = 64;

constexpr std::string_view PLAINTEXT_REPLY =
    "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-type: text/plain\r\n"
    "content-length: 38\r\n\r\nThis port speaks HTTPS (TLS) only.\r\n\r\n";

class TcpConnectionImpl final : public TcpConnection, public SessionHost {
public:
  TcpConnectionImpl(TcpServer &srv, int fd, bool tls, uint32_t source_slot,
                    const dataplane::Address &peer)
      : srv_(srv), fd_(fd), tls_(tls), source_slot_(source_slot), timer_(on_timer, this),
        peer_(peer) {
    uint64_t now = srv_.loop().now();
    accepted_at_ = last_activity_ = last_progress_ = now;
    state_ = tls_ ? State::peek : State::detect;
    srv_.loop().watch(fd_, this);
    update_timer();
  }

  ~TcpConnectionImpl() override {
    session_.reset(); // before the socket closes (it may still write its log lines)
    srv_.loop().timers().cancel(timer_);
    if (ssl_)
      SSL_free(ssl_);
    if (fd_ >= 0)
      close(fd_);
  }

  void on_io(uint32_t events) override {
    if (dead_)
      return;
    if (lingering_)
      return linger_read();
    if (events & (EPOLLERR | EPOLLHUP)) {
      if (!(events & EPOLLIN))
        return finish();
    }
    step();
  }

  TcpConnInfo info() const override {
    TcpConnInfo ci;
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    if (getpeername(fd_, reinterpret_cast<sockaddr *>(&ss), &sl) == 0) {
      ci.peer = dataplane::Address::from(reinterpret_cast<sockaddr *>(&ss), sl).to_string();
    }
    ci.proto = state_ != State::open ? "tls-handshake" : (h2_ ? "h2" : "http/1.1");
    ci.age_ms = (srv_.loop().now() - accepted_at_) / 1'000'000;
    ci.bytes_in = bytes_in_;
    ci.bytes_out = bytes_out_;
    ci.out_buffer = out_.capacity();
    ci.busy = busy();
    return ci;
  }
  // Lingering with output the client has not acknowledged too: a drain
  // waits for the end of the last response to be taken (until its
  // deadline), not for idle clients to close.
  bool busy() const override {
    if (lingering_) return unacked_output() > 0;
    return session_ && (session_->busy() || output_pending() > 0);
  }

  void resume() override {
    wake_pending_ = false;
    if (!dead_ && !lingering_)
      step();
  }

  void session_wake() override {
    if (!wake_pending_ && !dead_) {
      wake_pending_ = true;
      srv_.wake_later(this);
    }
  }

  // From accept(): valid after the peer reset the connection too.
  const dataplane::Address *session_peer() const override { return &peer_; }

  bool session_tls() const override { return tls_; }

  void shutdown() override {
    if (dead_ || lingering_)
      return;
    if (session_) {
      // The goodbye's round trip (HTTP/2: GOAWAY, PING, the last GOAWAY)
      // gets the whole write timeout, however long the connection was idle.
      last_progress_ = last_activity_ = srv_.loop().now();
      session_->shutdown();
      step();
    } else {
      finish();
    }
  }

private:
  enum class State { peek, detect, handshake, open };

  static void on_timer(dataplane::Timer &t) {
    static_cast<TcpConnectionImpl *>(t.owner())->timed_out();
  }

  void timed_out() {
    if (dead_)
      return;
    if (lingering_) {
      // While what was written before the FIN moves, the client gets the
      // write timeout between moves; once it has all of it, a moment more
      // to close first; and never more than twice the write timeout.
      const uint64_t now = srv_.loop().now();
      const int unsent = unacked_output();
      if (unsent < linger_unsent_) {
        linger_unsent_ = unsent;
        linger_moved_ = now;
      }
      const uint64_t wait = unsent == 0 ? LINGER_GRACE_NS : srv_.config().write_timeout;
      if (now - linger_moved_ >= wait || now - linger_started_ >= 2 * srv_.config().write_timeout)
        return finish();
      srv_.loop().timers().schedule(timer_, now + LINGER_TICK_NS);
      return;
    }
    auto &st = srv_.mutable_stats();
    switch (deadline_kind_) {
    case Deadline::trim:
      update_timer(); // gives the buffer back, then times the idle deadline
      return;
    case Deadline::handshake:
      st.timeouts_handshake += 1;
      break;
    case Deadline::headers:
      st.timeouts_headers += 1;
      break;
    case Deadline::write:
      st.timeouts_write += 1;
      break;
    case Deadline::idle:
      st.timeouts_idle += 1;
      break;
    }
    if (deadline_kind_ == Deadline::idle && session_) {
      // An idle connection gets a polite GOAWAY / close.
      session_->shutdown();
      step();
      if (!dead_)
        finish();
      return;
    }
    finish();
  }

  // Read what we may, run the protocol, write what it produced; repeat
  // while progress is made. Never blocks.
  void step() {
    int round = 0;
    for (; round < 8 && !dead_; ++round) {
      bool progressed = false;
      if (state_ == State::peek && !peek_tls())
        break;
      if (state_ == State::detect && !detect_protocol())
        break;
      if (state_ == State::handshake && !handshake())
        break;
      if (state_ != State::open)
        continue;
      if (!session_->input_paused() && output_pending() < srv_.config().max_output) {
        progressed |= read_input();
      }
      if (session_->has_buffered_input()) {
        session_->on_input(nullptr, 0, srv_.loop().now());
        progressed = true;
      }
      progressed |= write_output();
      if (dead_)
        return;
      // Writing may have let the session parse again (an answer it waited
      // for is whole) without a byte to send: its held input is taken in
      // the next round, not left until the idle timeout.
      if (session_->has_buffered_input())
        progressed = true;
      if (session_->finished() && output_pending() == 0)
        return peer_closed_ ? finish() : linger();
      // Requests still buffered in the session are answered before the
      // client's FIN ends the connection.
      if (peer_closed_ && output_pending() == 0 && !session_->busy() &&
          !session_->has_buffered_input())
        return finish();
      if (!progressed)
        break;
    }
    if (!dead_ && session_ && session_->counts_activity() &&
        session_->activity() != seen_activity_) {
      // Requests or responses moved (not only PINGs and window updates).
      seen_activity_ = session_->activity();
      last_progress_ = last_activity_ = srv_.loop().now();
      progress_mark_ = bytes_out_ + output_pending(); // all produced so far
    }
    if (!dead_) {
      bool want_read =
          state_ != State::open || (!session_->input_paused() &&
                                    output_pending() < srv_.config().max_output && !peer_closed_);
      // Cut short by the round cap with work left (a long pipeline read
      // at once, buffered in the session): nothing else would wake it, the
      // socket having nothing more to read, so the socket being writable
      // brings the next round at once.
      bool want_write = want_write_ || output_pending() > 0 || round == 8;
      srv_.loop().set_interest(fd_, this, want_read, want_write);
      update_timer();
    }
  }

  // Looks at the first bytes without consuming them. Returns how many, or
  // 0 when there is nothing yet (the connection is finished on EOF/error).
  size_t peek(char *buf, size_t len) {
    ssize_t n = recv(fd_, buf, len, MSG_PEEK);
    if (n > 0)
      return static_cast<size_t>(n);
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
      finish();
    return 0;
  }

  bool peek_tls() {
    char b;
    if (peek(&b, 1) == 0)
      return false;
    if (static_cast<uint8_t>(b) != 0x16) { // not a TLS handshake record: someone speaks plain text
      srv_.mutable_stats().plaintext_on_tls += 1;
      [[maybe_unused]] auto w =
          send(fd_, PLAINTEXT_REPLY.data(), PLAINTEXT_REPLY.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      finish();
      return false;
    }
    ssl_ = srv_.tls().new_ssl();
    if (!ssl_ || SSL_set_fd(ssl_, fd_) != 1) {
      finish();
      return false;
    }
    state_ = State::handshake;
    return true;
  }

  // Cleartext: HTTP/2 prior knowledge ("PRI " begins its preface) or
  // HTTP/1.1. The first bytes are taken, not peeked: while they are a part
  // of "PRI " (a client sending "PR" and stopping) a peek would leave them
  // readable and wake the loop at once, again and again.
  bool detect_protocol() {
    ssize_t n = recv(fd_, detect_buf_ + detected_, sizeof(detect_buf_) - detected_, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      finish();
      return false;
    }
    if (n < 0)
      return false;
    detected_ += static_cast<size_t>(n);
    const std::string_view got(detect_buf_, detected_);
    if (detected_ < sizeof(detect_buf_) && got == std::string_view("PRI ", detected_)) {
      return false; // wait for enough bytes to tell h2c from HTTP/1.1
    }
    open_session(got == "PRI ");
    bytes_in_ += detected_;
    srv_.mutable_stats().bytes_in += detected_;
    session_->on_input(reinterpret_cast<const uint8_t *>(detect_buf_), detected_,
                       srv_.loop().now());
    return true;
  }

  bool handshake() {
    ERR_clear_error();
    int rv = SSL_accept(ssl_);
    if (rv == 1) {
      const unsigned char *alpn = nullptr;
      unsigned int len = 0;
      SSL_get0_alpn_selected(ssl_, &alpn, &len);
      open_session(len == 2 && std::memcmp(alpn, "h2", 2) == 0);
      want_write_ = false;
      return true;
    }
    int err = SSL_get_error(ssl_, rv);
    if (err == SSL_ERROR_WANT_READ) {
      want_write_ = false;
      return false;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
      want_write_ = true;
      return false;
    }
    srv_.mutable_stats().tls_handshake_failed += 1;
    ERR_clear_error();
    finish();
    return false;
  }

  void open_session(bool h2) {
    h2_ = h2;
    session_ = h2 ? make_h2_session(srv_.env()) : make_h1_session(srv_.env());
    session_->set_host(this);
    state_ = State::open;
    last_activity_ = srv_.loop().now();
  }

  // Returns true when bytes arrived.
  bool read_input() {
    auto &buf = srv_.scratch();
    buf.resize(READ_CHUNK);
    size_t total = 0;
    for (int reads = 0; total < READ_BUDGET && !session_->input_paused(); ++reads) {
      if (reads == READS_PER_EVENT) {
        // The rest waits for the next pass (the socket stays readable).
        srv_.mutable_stats().reads_capped += 1;
        break;
      }
      ssize_t n;
      if (ssl_) {
        ERR_clear_error();
        int rv = SSL_read(ssl_, buf.data(), static_cast<int>(buf.size()));
        // A read that wanted to write (a KeyUpdate to answer into a full
        // socket) has written once it reads or wants to read again: the
        // socket is no longer watched for room on its account (what the
        // session has to send keeps it watched), or every pass would wake
        // on a writable socket with nothing to do.
        if (rv > 0) want_write_ = false;
        if (rv <= 0) {
          int err = SSL_get_error(ssl_, rv);
          if (err == SSL_ERROR_WANT_READ) {
            want_write_ = false;
            break;
          }
          if (err == SSL_ERROR_WANT_WRITE) {
            want_write_ = true;
            break;
          }
          ERR_clear_error();
          peer_closed_ = true; // clean close_notify, EOF or a TLS error
          break;
        }
        n = rv;
      } else {
        n = recv(fd_, buf.data(), buf.size(), 0);
        if (n == 0) {
          peer_closed_ = true;
          break;
        }
        if (n < 0) {
          if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            peer_closed_ = true;
          break;
        }
      }
      total += static_cast<size_t>(n);
      bytes_in_ += static_cast<uint64_t>(n);
      srv_.mutable_stats().bytes_in += static_cast<uint64_t>(n);
      session_->on_input(buf.data(), static_cast<size_t>(n), srv_.loop().now());
    }
    if (total && !session_->counts_activity())
      last_activity_ = srv_.loop().now();
    if (peer_closed_ && !input_ended_) {
      input_ended_ = true;
      session_->input_ended();
    }
    return total > 0;
  }

  size_t output_pending() const { return out_.size() - out_off_; }

  // Fills the output buffer from the session and writes it. The buffer is
  // reused across passes: no allocation per response in steady state.
  bool write_output() {
    bool progressed = false;
    for (int i = 0; i < 16; ++i) {
      if (out_off_ > 0 && out_off_ == out_.size()) {
        out_.clear();
        out_off_ = 0;
      } else if (out_off_ > 0) {
        out_.erase(out_.begin(), out_.begin() + static_cast<long>(out_off_));
        out_off_ = 0;
      }
      size_t before = out_.size();
      session_->produce(out_, srv_.config().max_output);
      if (out_.size() == 0)
        break;
      if (out_.size() == before && before == 0)
        break;
      size_t sent = 0;
      while (out_off_ < out_.size()) {
        ssize_t n;
        if (ssl_) {
          ERR_clear_error();
          int rv =
              SSL_write(ssl_, out_.data() + out_off_, static_cast<int>(out_.size() - out_off_));
          if (rv <= 0) {
            int err = SSL_get_error(ssl_, rv);
            if (err == SSL_ERROR_WANT_WRITE || err == SSL_ERROR_WANT_READ) {
              want_write_ = err == SSL_ERROR_WANT_WRITE;
              return progressed;
            }
            ERR_clear_error();
            finish();
            return progressed;
          }
          n = rv;
        } else {
          n = send(fd_, out_.data() + out_off_, out_.size() - out_off_, MSG_NOSIGNAL);
          if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
              want_write_ = true;
              return progressed;
            }
            finish();
            return progressed;
          }
        }
        srv_.mutable_stats().tls_writes += 1;
        srv_.mutable_stats().bytes_out += static_cast<uint64_t>(n);
        bytes_out_ += static_cast<uint64_t>(n);
        out_off_ += static_cast<size_t>(n);
        sent += static_cast<size_t>(n);
      }
      want_write_ = false;
      // Bytes of a request's answer reaching the client are progress (a
      // slow reader draining what was produced); those of PING or SETTINGS
      // answers produced since are not.
      if (sent && (!session_->counts_activity() || bytes_out_ - sent < progress_mark_)) {
        last_progress_ = last_activity_ = srv_.loop().now();
      }
      if (sent) progressed = true;
    }
    return progressed;
  }

  // trim: not a deadline; when an idle connection gives back its buffer.
  enum class Deadline { handshake, headers, write, idle, trim };

  void update_timer() {
    const auto &cfg = srv_.config();
    uint64_t at;
    if (state_ != State::open) {
      deadline_kind_ = Deadline::handshake;
      at = accepted_at_ + cfg.handshake_timeout;
    } else if (uint64_t h = session_->headers_started()) {
      deadline_kind_ = Deadline::headers;
      at = h + cfg.header_timeout;
    } else if (output_pending() > 0 || (session_->busy() && !session_->timed_by_session())) {
      // Requests open but nothing moving either way: a client that stopped
      // reading or never opens its flow-control window.
      if (session_timed_) {
        // Output after a quiet spell the session timed itself: the client
        // has the whole write timeout from now to take it.
        session_timed_ = false;
        last_progress_ = srv_.loop().now();
      }
      deadline_kind_ = Deadline::write;
      at = std::max(last_progress_, last_activity_) + cfg.write_timeout;
    } else if (session_->busy()) {
      session_timed_ = true;
      srv_.loop().timers().cancel(timer_); // the session's deadlines hold
      return;
    } else {
      deadline_kind_ = Deadline::idle;
      at = last_activity_ + cfg.idle_timeout;
      // A download grew the buffer up to the output limit and a frame: a
      // keep-alive connection quiet for a second gives that back instead
      // of holding it until it closes (and one between back-to-back
      // downloads keeps it).
      if (out_.capacity() > KEEP_IDLE_OUTPUT) {
        const uint64_t trim_at = last_activity_ + TRIM_IDLE_OUTPUT_NS;
        if (srv_.loop().now() >= trim_at) {
          std::vector<uint8_t>().swap(out_);
          out_off_ = 0;
        } else if (trim_at < at) {
          deadline_kind_ = Deadline::trim;
          at = trim_at;
        }
      }
    }
    srv_.loop().timers().schedule(timer_, at);
  }

  // The session ended the connection with the client still able to send
  // (HTTP/1.1 after "Connection: close" or an error, HTTP/2 after its
  // GOAWAY). Closing a socket with unread input sends a reset, and a reset
  // throws away what the kernel has not sent yet: the end of the last
  // response. So the close_notify and a FIN go after the response, and
  // what the client still sends is read and dropped until it closes, 1 MiB
  // of it came, or the time runs out (see timed_out()).
  void linger() {
    if (ssl_ && state_ == State::open && !session_->cut_short()) {
      ERR_clear_error();
      SSL_shutdown(ssl_);
      ERR_clear_error();
    }
    if (::shutdown(fd_, SHUT_WR) != 0)
      return finish();
    notified_ = true;
    lingering_ = true;
    linger_unsent_ = unacked_output();
    linger_started_ = linger_moved_ = srv_.loop().now();
    srv_.loop().set_interest(fd_, this, true, false);
    srv_.loop().timers().schedule(timer_, linger_started_ + LINGER_TICK_NS);
    linger_read();
  }

  void linger_read() {
    char junk[16384];
    for (;;) {
      ssize_t n = recv(fd_, junk, sizeof(junk), MSG_DONTWAIT);
      if (n > 0) {
        lingered_ += static_cast<size_t>(n);
        if (lingered_ > MAX_LINGER_INPUT)
          return finish();
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
      return finish(); // the client closed (or the connection broke)
    }
  }

  // Bytes written that the client has not acknowledged yet.
  int unacked_output() const {
    int n = 0;
    return ioctl(fd_, SIOCOUTQ, &n) == 0 ? n : 0;
  }

  void finish() {
    if (dead_)
      return;
    dead_ = true;
    srv_.loop().timers().cancel(timer_);
    if (ssl_ && state_ == State::open && !notified_ && !session_->cut_short()) {
      ERR_clear_error();
      SSL_shutdown(ssl_); // best effort close_notify
      ERR_clear_error();
    }
    srv_.loop().unwatch(fd_);
    srv_.closed(this, source_slot_);
  }

  TcpServer &srv_;
  int fd_;
  bool tls_;
  uint32_t source_slot_;
  SSL *ssl_ = nullptr;
  State state_;
  std::unique_ptr<TcpSession> session_;
  static constexpr size_t KEEP_IDLE_OUTPUT = 64 * 1024;
  static constexpr size_t MAX_LINGER_INPUT = 1 << 20;
  bool lingering_ = false;  // linger(): output done, reading what still comes
  bool notified_ = false;   // close_notify sent
  int linger_unsent_ = 0;   // unacknowledged output at the last look
  uint64_t linger_started_ = 0;
  uint64_t linger_moved_ = 0; // when the unacknowledged output last shrank
  static constexpr uint64_t LINGER_TICK_NS = 250'000'000;
  static constexpr uint64_t LINGER_GRACE_NS = 1'000'000'000;
  size_t lingered_ = 0;     // bytes read and dropped while lingering
  static constexpr uint64_t TRIM_IDLE_OUTPUT_NS = 1'000'000'000;
  std::vector<uint8_t> out_;
  char detect_buf_[4];  // the first bytes of a cleartext connection
  size_t detected_ = 0;
  size_t out_off_ = 0;
  dataplane::Timer timer_;
  Deadline deadline_kind_ = Deadline::handshake;
  uint64_t accepted_at_, last_activity_, last_progress_;
  bool session_timed_ = false; // the last update_timer() left the session its own deadlines
  uint64_t seen_activity_ = 0;  // session_->activity() when last_activity_ was set from it
  uint64_t progress_mark_ = 0;  // output offset up to which sending it is progress (activity)
  bool want_write_ = false;
  bool peer_closed_ = false;
  bool input_ended_ = false; // the session was told
  bool dead_ = false;
  bool wake_pending_ = false;
  const dataplane::Address peer_; // as accept() reported it
  bool h2_ = false;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

} // namespace

std::unique_ptr<TcpConnection> make_tcp_connection(TcpServer &srv, int fd, bool tls,
                                                   uint32_t source_slot,
                                                   const dataplane::Address &peer) {
  return std::make_unique<TcpConnectionImpl>(srv, fd, tls, source_slot, peer);
}

} // namespace xdpq::http

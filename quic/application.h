#pragma once
// The seam between a QUIC connection and the application protocol on top of
// it (HTTP/3, implemented in http/): the connection moves stream bytes and
// flow-control credit, the application parses and produces them. quic/
// knows nothing of HTTP; the worker hands the endpoint a factory.
//
// The shape follows ngtcp2's own split between transport and codec: the
// application is driven from the connection's ngtcp2 callbacks and write
// loop, and calls back into the connection through AppTransport.

#include "dataplane/address.h"

#include <ngtcp2/ngtcp2.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace xdpq::quic {

// What the application may ask of the connection under it.
class AppTransport {
public:
  // The application consumed n bytes of stream data (flow-control credit).
  void app_consume(int64_t stream_id, uint64_t n) {
    app_consume_stream(stream_id, n);
    app_consume_conn(n);
  }
  // Either part alone: a body held for someone slower (a proxied upload)
  // gives the connection's credit back as it arrives, so that a few
  // stalled streams cannot stall the others, and the stream's as it leaves.
  virtual void app_consume_stream(int64_t stream_id, uint64_t n) = 0;
  virtual void app_consume_conn(uint64_t n) = 0;
  // Ask the peer to stop sending on the stream (STOP_SENDING).
  virtual void app_stop_reading(int64_t stream_id, uint64_t app_error) = 0;
  // Abandon our side of the stream (RESET_STREAM).
  virtual void app_reset_writing(int64_t stream_id, uint64_t app_error) = 0;
  // The peer's bytes had the application abandon a request it may have
  // begun serving (a malformed message): a cancel like the peer's own
  // RESET_STREAM, charged alike. False, counted, when the connection's
  // allowance is spent: the application then fails its read with
  // excessive_load_code().
  virtual bool app_charge_cancel() { return true; }
  // Opens a unidirectional stream of ours; its id, or -1.
  virtual int64_t app_open_uni_stream() = 0;
  // The application has new data to send outside the connection's own
  // read and write (a proxied response arrived): write at the end of the
  // pass.
  virtual void app_want_write() {}
  // The peer's address (X-Forwarded-For, the access log), or null if
  // unknown: the one the handshake or the latest path validation proved.
  // Before the handshake completes (0-RTT), where its packets came from,
  // which nothing has proven (app_peer_proven() false): anyone holding the
  // connection's keys can write any source address into a datagram.
  virtual const dataplane::Address *app_peer() const { return nullptr; }
  virtual bool app_peer_proven() const { return false; }
  // Bytes the peer's flow control lets out now: on the stream (the stream's
  // window; raising it calls the application's unblock_stream()), and on
  // the connection (its window: the connection writes when it rises).
  virtual uint64_t app_stream_credit(int64_t stream_id) const {
    (void)stream_id;
    return UINT64_MAX;
  }
  virtual uint64_t app_conn_credit() const { return UINT64_MAX; }
  // The connection's clock (ns): the one its timers run on.
  virtual uint64_t app_now() const = 0;
  // Whether packets the peer has not acknowledged are in flight.
  virtual bool app_awaits_acks() const = 0;
  // A write of the connection (before_write() included) at or after at_ns,
  // whatever else happens by then; a later call replaces the time.
  virtual void app_wake_at(uint64_t at_ns) = 0;
  // The application's library (nghttp3) took (+) or gave back (-) bytes:
  // counted with the connection's (Endpoint::max_memory).
  virtual void app_charge_memory(int64_t bytes) { (void)bytes; }

protected:
  ~AppTransport() = default;
};

// One connection's application protocol. Errors are the application's own
// (negative) codes; app_error_code() maps one to the QUIC application error
// code the connection closes with. Callers never let exceptions in.
class Application {
public:
  virtual ~Application() = default;

  // The 1-RTT keys are ready: open the streams the protocol needs.
  virtual int start(uint64_t max_client_bidi_streams) = 0;
  // Stream data in. Returns the bytes to credit at once (the application
  // credits the rest itself through app_consume), or a negative error.
  virtual int64_t read_stream(int64_t stream_id, const uint8_t *data, size_t len, bool fin,
                              bool early) = 0;
  // Data to send: fills vec (up to veccnt) for one stream, sets stream_id
  // (-1: nothing) and fin. Returns the count or a negative error.
  virtual int64_t writev_stream(int64_t &stream_id, int &fin, ngtcp2_vec *vec, size_t veccnt) = 0;
  // The start of every write, asked for stream data or not (the
  // connection's window may be spent): stream resets the application
  // decided on go to the transport now, as they need no credit. Negative:
  // the application gives up on the peer; the connection closes with
  // app_error_code() of it.
  virtual int64_t before_write() { return 0; }
  // The end of every write that began (what was lost is sent again by now).
  virtual void after_write() {}
  virtual int add_write_offset(int64_t stream_id, size_t n) = 0;
  virtual int add_ack_offset(int64_t stream_id, uint64_t n) = 0;
  // Flow control blocked the stream / lifted the block.
  virtual void block_stream(int64_t stream_id) = 0;
  virtual int unblock_stream(int64_t stream_id) = 0;
  virtual void shutdown_stream_write(int64_t stream_id) = 0;
  virtual void shutdown_stream_read(int64_t stream_id) = 0;
  // The peer abandoned its side of the stream (RESET_STREAM): as
  // shutdown_stream_read(), and the application may abandon its own side.
  virtual void peer_reset(int64_t stream_id) { shutdown_stream_read(stream_id); }
  // The whole response of this open stream was handed to the transport
  // (some may not have left yet): a STOP_SENDING now cancels no work of
  // ours (the client closing a body it does not read to the end).
  virtual bool answered(int64_t stream_id) const {
    (void)stream_id;
    return false;
  }
  // The peer opened a request stream (before any byte of it is read).
  virtual void stream_opened(int64_t stream_id) { (void)stream_id; }
  // The stream is gone (app_error: the code it closed with).
  virtual int close_stream(int64_t stream_id, uint64_t app_error) = 0;
  virtual void set_max_client_streams_bidi(uint64_t n) = 0;
  // Graceful shutdown in two steps (RFC 9114 5.2): shutdown_notice() tells
  // the peer no stream is refused yet (GOAWAY with the largest id);
  // shutdown_final(), a round trip later, names the last stream that will
  // be served (the requests the peer sent before it saw the first one
  // arrived meanwhile). Streams in flight finish.
  virtual void shutdown_notice() = 0;
  virtual void shutdown_final() = 0;
  virtual size_t active_streams() const = 0;
  // A request is complete and its answer will come from elsewhere (an
  // upstream), not from this read: the connection may hold the request's
  // ACK for the answer to carry.
  virtual bool answer_pending() const { return false; }

  // The application error code for one of our negative error codes.
  virtual uint64_t app_error_code(int64_t error) const = 0;
  // The code for "closing without an error" and for an internal error.
  virtual uint64_t no_error_code() const = 0;
};

// Makes the application for each new connection (one per worker).
class ApplicationFactory {
public:
  virtual ~ApplicationFactory() = default;
  // Throws std::bad_alloc and the like; the connection catches.
  virtual std::unique_ptr<Application> create(AppTransport &transport) = 0;
  // Its counters and the like, for the worker (opaque to quic/).
  virtual uint64_t no_error_code() const = 0;
  // The code that closes a connection whose peer resets streams faster than
  // the connection's limit allows.
  virtual uint64_t excessive_load_code() const = 0;
};

} // namespace xdpq::quic

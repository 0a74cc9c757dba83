#include "control/worker.h"

namespace xdpq::control {

namespace {
unsigned long long ull(uint64_t v) { return v; }
} // namespace

void Worker::log_stats() const {
  const auto &p = port_->stats();
  const auto &e = endpoint_.stats();
  const auto &h = endpoint_.h3_stats();
  LOG_INFO("worker %d: rx %llu datagrams %llu bytes, tx %llu datagrams %llu bytes in %llu sends "
           "(%llu GSO), tx dropped %llu, rx truncated %llu",
           id_, ull(p.rx_datagrams), ull(p.rx_bytes), ull(p.tx_datagrams), ull(p.tx_bytes),
           ull(p.tx_sends), ull(p.tx_gso_batches), ull(p.tx_dropped), ull(p.rx_truncated));
  LOG_INFO("worker %d: handshakes %llu started %llu completed %llu failed, %llu resumed, "
           "%llu with 0-RTT, %llu retries, %llu version negotiations, %llu stateless resets, "
           "%llu closed (%llu idle, %llu errors), %llu key updates, %llu path validations "
           "(%llu failed)",
           id_, ull(e.handshakes_started), ull(e.handshakes_completed),
           ull(e.handshakes_failed), ull(e.sessions_resumed), ull(e.early_data_accepted),
           ull(e.retries_sent), ull(e.version_negotiations), ull(e.stateless_resets_sent),
           ull(e.conns_closed), ull(e.conns_idle_closed), ull(e.conn_errors),
           ull(e.key_updates), ull(e.path_validations_ok), ull(e.path_validations_failed));
  LOG_INFO("worker %d: dropped: unparsable %llu, small initial %llu, unknown packet %llu, "
           "bad token %llu, connection limit %llu, amplification %llu, reset rate %llu, "
           "closing %llu",
           id_, ull(e.drop_unparsable), ull(e.drop_small_initial), ull(e.drop_unknown_packet),
           ull(e.drop_bad_token), ull(e.drop_conn_limit), ull(e.drop_amplification),
           ull(e.drop_reset_rate), ull(e.drop_closing));
  LOG_INFO("worker %d: requests %llu (2xx %llu, 3xx %llu, 4xx %llu, 5xx %llu), header limit "
           "%llu, body limit %llu",
           id_, ull(h.requests), ull(h.responses_by_class[2]), ull(h.responses_by_class[3]),
           ull(h.responses_by_class[4]), ull(h.responses_by_class[5]),
           ull(h.header_limit_rejects), ull(h.body_limit_rejects));
}

} // namespace xdpq::control

#pragma once
// The bytes a peer can make the server hold on its behalf: request bodies
// being received, and the responses made from them (an /echo body) until
// they are sent. They are budgeted per stream (the request body limit, 413),
// per connection and per worker; a request that would go over a budget is
// refused (HTTP/3 H3_REQUEST_REJECTED, HTTP/2 REFUSED_STREAM, HTTP/1.1 503)
// and its bytes are discarded instead of held, so no peer, and no set of
// peers, can make a worker hold more than its budget.
//
// One MemoryBudget per worker (one thread); one BudgetAccount per
// connection; streams remember what they took and give it back.

#include <cstddef>
#include <cstdint>

namespace xdpq::http {

struct BudgetLimits {
  size_t per_connection = 16u << 20;
  size_t per_worker = 256u << 20;
};

class MemoryBudget {
public:
  explicit MemoryBudget(size_t limit) : limit_(limit) {}
  size_t held() const { return held_; }
  size_t limit() const { return limit_; }
  uint64_t refusals() const { return refusals_; }

private:
  friend class BudgetAccount;
  size_t limit_;
  size_t held_ = 0;
  uint64_t refusals_ = 0;
};

class BudgetAccount {
public:
  // worker may be null (tests): then only the per-connection limit applies.
  BudgetAccount(MemoryBudget *worker, size_t limit) : worker_(worker), limit_(limit) {}
  ~BudgetAccount() { give_back(held_); }
  BudgetAccount(const BudgetAccount &) = delete;
  BudgetAccount &operator=(const BudgetAccount &) = delete;

  // Takes n bytes if both this connection and the worker stay within their
  // budgets; false (nothing taken, a refusal counted) otherwise.
  bool try_take(size_t n) {
    own_limit_refused_ = held_ + n > limit_;
    if (own_limit_refused_ || (worker_ && worker_->held_ + n > worker_->limit_)) {
      if (worker_) worker_->refusals_ += 1;
      return false;
    }
    held_ += n;
    if (worker_) worker_->held_ += n;
    return true;
  }
  void give_back(size_t n) {
    if (n > held_) n = held_;
    held_ -= n;
    if (worker_) worker_->held_ -= n;
  }
  size_t held() const { return held_; }
  // The last refusal was this connection's own limit (what the peer itself
  // holds), not the worker's (what all peers hold).
  bool own_limit_refused() const { return own_limit_refused_; }

private:
  MemoryBudget *worker_;
  bool own_limit_refused_ = false;
  size_t limit_;
  size_t held_ = 0;
};

} // namespace xdpq::http

#include "h2/transport/ring.hpp"

#include "h2/core/error.hpp"

#include <algorithm>

namespace h2::transport::ring {

credit_writer::credit_writer(std::uint64_t capacity,
                             std::uint64_t max_notifications)
    : capacity_(capacity), max_notifications_(max_notifications) {
  H2_ENFORCE(capacity > 0 && max_notifications > 0, "capacity ", capacity,
             ", max_notifications ", max_notifications);
}

std::uint64_t credit_writer::free_bytes() const noexcept {
  // A place is free once the reader returned it and the hardware read it.
  return free_space(staged_, std::min(returned_, completed_), capacity_);
}

void credit_writer::stage(std::uint64_t n) {
  H2_ENFORCE(n <= free_bytes(), "staging ", n, " bytes, ", free_bytes(),
             " free");
  staged_ += n;
}

void credit_writer::post(std::uint64_t end) {
  H2_ENFORCE(posted_ < end && end <= staged_ && may_notify(), "posting to ",
             end, ", posted ", posted_, ", staged ", staged_, ", ",
             notifications_.size(), " notifications in flight");
  posted_ = end;
  notifications_.push_back(end);
}

void credit_writer::complete(std::uint64_t end) {
  H2_ENFORCE(end <= posted_, "completion to ", end, ", posted ", posted_);
  completed_ = std::max(completed_, end);
}

bool credit_writer::credit(std::uint64_t n) noexcept {
  if (n > posted_ - returned_)
    return false;
  returned_ += n;
  // The reader consumed these bytes, so it saw (and reposted the receive
  // of) every notification that carried them.
  while (!notifications_.empty() && notifications_.front() <= returned_)
    notifications_.pop_front();
  return true;
}

credit_reader::credit_reader(std::uint64_t capacity, std::uint64_t threshold)
    : capacity_(capacity), threshold_(threshold) {
  H2_ENFORCE(capacity > 0 && threshold > 0 && threshold <= capacity,
             "capacity ", capacity, ", threshold ", threshold);
}

bool credit_reader::arrive(std::uint64_t n) noexcept {
  if (n > capacity_ - available())
    return false;
  arrived_ += n;
  return true;
}

void credit_reader::consume(std::uint64_t n) {
  H2_ENFORCE(n <= available(), "consuming ", n, " bytes, ", available(),
             " available");
  consumed_ += n;
}

std::uint64_t credit_reader::credit_due() const noexcept {
  const std::uint64_t owed = consumed_ - credited_;
  if (owed >= threshold_ || (owed > 0 && available() == 0))
    return owed;
  return 0;
}

void credit_reader::credit_sent(std::uint64_t n) {
  H2_ENFORCE(n <= consumed_ - credited_, "returning ", n, " bytes, ",
             consumed_ - credited_, " owed");
  credited_ += n;
}

} // namespace h2::transport::ring

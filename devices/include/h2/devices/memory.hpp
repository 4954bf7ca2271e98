// Memory accounting with a hard capacity (docs/architecture.md, "Device context").
//
// Every CPU tensor allocated on a thread bound to a chip (thread_binding) is
// charged to that chip's memory_account until the tensor's storage is freed,
// on whichever thread that happens. An allocation past the capacity fails
// with device_error(out_of_memory) naming the chip, as on a real device.
#pragma once

#include "h2/core/error.hpp"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace h2::devices {

/// The bytes a chip holds, its peak, and its capacity. Thread-safe.
class memory_account {
public:
  /// `chip` names the chip in errors ("0:2 (emulated:a100-sxm-40gb)").
  memory_account(std::string chip, std::uint64_t capacity_bytes);

  /// Charges `bytes`; throws device_error(out_of_memory) when the charge
  /// would exceed the capacity (nothing is charged then).
  void reserve(std::uint64_t bytes);

  /// Returns `bytes` charged earlier. Never throws.
  void release(std::uint64_t bytes) noexcept;

  std::uint64_t used_bytes() const noexcept { return used_.load(); }
  std::uint64_t peak_bytes() const noexcept { return peak_.load(); }
  std::uint64_t capacity_bytes() const noexcept { return capacity_; }
  const std::string& chip() const noexcept { return chip_; }

  /// Starts a new peak measurement at the current usage.
  void reset_peak() noexcept { peak_.store(used_.load()); }

  /// The message of the last out-of-memory failure (empty if none); kept
  /// because libtorch may rethrow errors from inside ops as its own type.
  std::string last_failure() const;

  /// How many reservations have failed so far: compare before and after an
  /// operation to tell whether it ran out of memory.
  std::uint64_t failures() const noexcept { return failures_.load(); }

private:
  std::string chip_;
  std::uint64_t capacity_;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> peak_{0};
  std::atomic<std::uint64_t> failures_{0};
  mutable std::mutex failure_mutex_;
  std::string failure_; ///< the latest failure; guarded by failure_mutex_
};

/// Binds the calling thread's CPU allocations to `account` for the binding's
/// lifetime (nests; restores the previous binding). Installs the accounting
/// allocator into c10 on first use.
class memory_binding {
public:
  explicit memory_binding(std::shared_ptr<memory_account> account);
  ~memory_binding();
  memory_binding(const memory_binding&) = delete;
  memory_binding& operator=(const memory_binding&) = delete;

private:
  std::shared_ptr<memory_account> previous_;
};

/// The account the calling thread is bound to (nullptr if none).
const std::shared_ptr<memory_account>& current_account() noexcept;

/// A zero-copy alias of `tensor` whose bytes are charged to `account` for as
/// long as the alias (or anything sharing its storage) lives: how a chip
/// takes over a tensor handed to it in-process. The original storage stays
/// alive (and charged to its own account) while the alias exists. Throws
/// device_error(out_of_memory) when `account` cannot hold it.
at::Tensor adopt(const at::Tensor& tensor,
                 const std::shared_ptr<memory_account>& account);

/// Moves the charge for `tensor`'s storage to `account`, without copying a
/// byte: how a chip takes over state another chip of this process has let
/// go of for good (a layer that moved, runtime/migration.hpp). Done only
/// when `tensor` is the storage's one holder and the storage is this
/// process's charged host memory (accounting allocator or adopt()): true
/// then, the storage now charged to `account` alone until freed. False,
/// changing nothing, otherwise (someone else still holds it, a shm block,
/// another device's memory): the caller copies instead. A null `account`
/// charges it to nobody: how the giver lets go of it before sending it, so
/// that its own account drops at once and not when the taker takes it.
/// Throws device_error(out_of_memory) when `account` cannot hold it
/// (nothing changes then).
bool move_charge(const at::Tensor& tensor,
                 const std::shared_ptr<memory_account>& account);

/// The account `tensor`'s storage is charged to: the chip bound when it
/// was allocated, or the chip that adopted it; nullptr when none is (host
/// memory allocated unbound, or another device's). Never throws.
const memory_account* charged_account(const at::Tensor& tensor) noexcept;

/// Bytes of the storage behind `tensor` (0 for undefined tensors).
std::uint64_t storage_bytes(const at::Tensor& tensor) noexcept;

} // namespace h2::devices

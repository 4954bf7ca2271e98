#include "h2/devices/memory.hpp"

#include "h2/devices/torch_compat.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <mutex>

namespace h2::devices {

namespace {

std::string format_bytes(std::uint64_t bytes) {
  char buf[32];
  double v = static_cast<double>(bytes);
  const char* unit = "B";
  for (const char* u : {"KiB", "MiB", "GiB", "TiB"}) {
    if (v < 1024)
      break;
    v /= 1024;
    unit = u;
  }
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, unit);
  return buf;
}

thread_local std::shared_ptr<memory_account> bound_account;

/// Every allocation through the accounting allocator starts with this
/// header, just before the data: who was charged, and how much. Keeping the
/// header in the block (instead of a DataPtr context) makes the data
/// pointer its own context, which c10's raw_allocate() requires.
struct allocation_header {
  std::shared_ptr<memory_account> account; ///< null: not charged
  std::uint64_t bytes = 0;
};

/// 64 bytes keep the data at the base allocator's 64-byte alignment.
constexpr std::size_t header_bytes = 64;
static_assert(sizeof(allocation_header) <= header_bytes);

c10::Allocator* base_allocator = nullptr;
c10::DeleterFnPtr base_raw_deleter = nullptr;

void free_charged(void* data) {
  if (data == nullptr)
    return;
  void* raw = static_cast<char*>(data) - header_bytes;
  auto* h = static_cast<allocation_header*>(raw);
  if (h->account)
    h->account->release(h->bytes);
  h->~allocation_header();
  base_raw_deleter(raw);
}

/// Wraps c10's CPU allocator: allocations made on a bound thread are charged
/// to its account until freed (on any thread); all others are only
/// forwarded.
class accounting_allocator final : public c10::Allocator {
public:
  c10::DataPtr allocate(size_t n) H2_ALLOCATE_CONST override {
    const auto& account = bound_account;
    if (account)
      account->reserve(n);
    void* raw = nullptr;
    try {
      raw = base_allocator->raw_allocate(n + header_bytes);
    } catch (...) {
      if (account)
        account->release(n);
      throw;
    }
    new (raw) allocation_header{account, n};
    void* data = static_cast<char*>(raw) + header_bytes;
    return c10::DataPtr(data, data, &free_charged, c10::Device(c10::kCPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_charged; }

  H2_ALLOCATOR_COPY_DATA
};

void install_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    base_allocator = c10::GetAllocator(c10::kCPU);
    base_raw_deleter = base_allocator->raw_deleter();
    H2_ENFORCE(base_raw_deleter != nullptr,
               "c10's CPU allocator has no raw deleter");
    // Static lifetime, as c10::SetAllocator requires.
    static accounting_allocator allocator;
    c10::SetAllocator(c10::kCPU, &allocator, /*priority=*/10);
  });
}

} // namespace

memory_account::memory_account(std::string chip, std::uint64_t capacity_bytes)
    : chip_(std::move(chip)), capacity_(capacity_bytes) {
}

void memory_account::reserve(std::uint64_t bytes) {
  std::uint64_t used = used_.load();
  for (;;) {
    if (bytes > capacity_ || used > capacity_ - bytes) {
      std::string msg = "chip " + chip_ +
                        " is out of memory: tried to "
                        "allocate " +
                        format_bytes(bytes) + " with " + format_bytes(used) +
                        " of " + format_bytes(capacity_) + " in use";
      {
        std::lock_guard<std::mutex> guard(failure_mutex_);
        failure_ = msg;
      }
      ++failures_;
      throw device_error(device_errc::out_of_memory, msg);
    }
    if (used_.compare_exchange_weak(used, used + bytes))
      break;
  }
  std::uint64_t now = used + bytes;
  std::uint64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void memory_account::release(std::uint64_t bytes) noexcept {
  used_.fetch_sub(bytes);
}

std::string memory_account::last_failure() const {
  std::lock_guard<std::mutex> guard(failure_mutex_);
  return failure_;
}

memory_binding::memory_binding(std::shared_ptr<memory_account> account) {
  install_allocator();
  previous_ = std::move(bound_account);
  bound_account = std::move(account);
}

memory_binding::~memory_binding() {
  bound_account = std::move(previous_);
}

const std::shared_ptr<memory_account>& current_account() noexcept {
  return bound_account;
}

std::uint64_t storage_bytes(const at::Tensor& tensor) noexcept {
  if (!tensor.defined() || !tensor.has_storage())
    return 0;
  return tensor.storage().nbytes();
}

namespace {

/// What an adopted alias's storage keeps: the original storage, and the
/// charge to the adopting account.
struct adopted_block {
  c10::Storage keep;
  std::shared_ptr<memory_account> account;
  std::uint64_t bytes = 0;
};

void free_adopted(void* context) {
  auto* a = static_cast<adopted_block*>(context);
  if (a->account) // none once move_charge() let it go
    a->account->release(a->bytes);
  delete a; // drops the original storage
}

} // namespace

at::Tensor adopt(const at::Tensor& tensor,
                 const std::shared_ptr<memory_account>& account) {
  if (!tensor.defined())
    return tensor;
  const auto storage = tensor.storage();
  const std::uint64_t bytes = storage.nbytes();
  account->reserve(bytes);
  std::unique_ptr<adopted_block> block;
  try {
    block.reset(new adopted_block{storage, account, bytes});
  } catch (...) {
    account->release(bytes);
    throw;
  }
  // From here on the alias's deleter owns the charge.
  c10::DataPtr data(storage.data_ptr().get(), block.release(), &free_adopted,
                    storage.device());
  c10::Storage alias(c10::Storage::use_byte_size_t(), storage.nbytes(),
                     std::move(data), nullptr, /*resizable=*/false);
  return at::empty({0}, tensor.options())
    .set_(alias, tensor.storage_offset(), tensor.sizes(), tensor.strides());
}

bool move_charge(const at::Tensor& tensor,
                 const std::shared_ptr<memory_account>& account) {
  if (!tensor.defined() || !tensor.has_storage() || !tensor.is_cpu())
    return false;
  const auto& storage = tensor.storage();
  // Another holder would keep using memory no longer charged to it.
  if (storage.use_count() != 1)
    return false;
  const auto& data = storage.data_ptr();
  std::shared_ptr<memory_account>* charged = nullptr;
  std::uint64_t bytes = 0;
  if (data.get_deleter() == &free_charged && data.get() != nullptr) {
    auto* h = static_cast<allocation_header*>(
      static_cast<void*>(static_cast<char*>(data.get()) - header_bytes));
    charged = &h->account;
    bytes = h->bytes;
  } else if (data.get_deleter() == &free_adopted) {
    auto* a = static_cast<adopted_block*>(data.get_context());
    // An alias: whoever still holds the original writes the same bytes.
    if (a->keep.use_count() != 1)
      return false;
    charged = &a->account;
    bytes = a->bytes;
  } else {
    return false;
  }
  if (*charged == account)
    return true;
  if (account)
    account->reserve(bytes); // throws, changing nothing
  if (*charged)
    (*charged)->release(bytes);
  *charged = account;
  return true;
}

const memory_account* charged_account(const at::Tensor& tensor) noexcept {
  if (!tensor.defined() || !tensor.has_storage())
    return nullptr;
  const auto& data = tensor.storage().data_ptr();
  if (data.get_deleter() == &free_charged && data.get() != nullptr)
    return static_cast<const allocation_header*>(
             static_cast<const void*>(static_cast<const char*>(data.get()) -
                                      header_bytes))
      ->account.get();
  if (data.get_deleter() == &free_adopted)
    return static_cast<const adopted_block*>(data.get_context())->account.get();
  return nullptr;
}

} // namespace h2::devices

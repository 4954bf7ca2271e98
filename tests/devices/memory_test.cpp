#include "h2/devices/memory.hpp"
#include "expect_contains.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <barrier>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace h2::devices {
namespace {

std::shared_ptr<memory_account> account(const std::string& chip,
                                        std::uint64_t capacity) {
  return std::make_shared<memory_account>(chip, capacity);
}

using test::expect_contains;

// ---------------------------------------------------------------------------
// memory_account

TEST(devices_memory_account, reserve_release_and_peak) {
  memory_account a("0:0 (cpu)", 1000);
  EXPECT_EQ(a.chip(), "0:0 (cpu)");
  EXPECT_EQ(a.capacity_bytes(), 1000u);
  EXPECT_EQ(a.used_bytes(), 0u);
  a.reserve(100);
  a.reserve(200);
  EXPECT_EQ(a.used_bytes(), 300u);
  EXPECT_EQ(a.peak_bytes(), 300u);
  a.release(200);
  EXPECT_EQ(a.used_bytes(), 100u);
  EXPECT_EQ(a.peak_bytes(), 300u);
  a.reset_peak();
  EXPECT_EQ(a.peak_bytes(), 100u);
  a.reserve(900); // exactly full
  EXPECT_EQ(a.used_bytes(), 1000u);
  EXPECT_EQ(a.peak_bytes(), 1000u);
  a.release(1000);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.last_failure(), "");
}

TEST(devices_memory_account, reserve_past_capacity_throws_and_charges_nothing) {
  memory_account a("0:3 (emulated:a100-sxm-40gb)", 1000);
  a.reserve(600);
  try {
    a.reserve(500);
    FAIL() << "reserve past capacity succeeded";
  } catch (const device_error& e) {
    EXPECT_EQ(e.code(), device_errc::out_of_memory);
    std::string what = e.what();
    expect_contains(what, "0:3 (emulated:a100-sxm-40gb)");
    expect_contains(what, "out of memory");
    expect_contains(what, "500.0 B");  // the request
    expect_contains(what, "600.0 B");  // in use
    expect_contains(what, "1000.0 B"); // capacity
    EXPECT_EQ(a.last_failure(), what);
  }
  EXPECT_EQ(a.used_bytes(), 600u);
  EXPECT_EQ(a.peak_bytes(), 600u);
  a.reserve(400); // what remains still fits
  EXPECT_EQ(a.used_bytes(), 1000u);
}

TEST(devices_memory_account, last_failure_is_the_latest) {
  memory_account a("0:1 (emulated:mi250x)", 1000);
  EXPECT_THROW(a.reserve(2000), device_error);
  expect_contains(a.last_failure(), "2.0 KiB"); // 2000 B
  a.reserve(900);
  try {
    a.reserve(300);
    FAIL() << "reserve past capacity succeeded";
  } catch (const device_error& e) {
    // The message a caller recovers after libtorch wrapped the error must
    // describe this failure, not an older one.
    EXPECT_EQ(a.last_failure(), e.what());
    expect_contains(a.last_failure(), "300.0 B");
    expect_contains(a.last_failure(), "900.0 B");
  }
}

TEST(devices_memory_account, request_larger_than_capacity) {
  memory_account a("1:0 (emulated:h100-sxm)", 1u << 20);
  try {
    a.reserve(std::uint64_t{3} << 30);
    FAIL() << "reserve past capacity succeeded";
  } catch (const device_error& e) {
    EXPECT_EQ(e.code(), device_errc::out_of_memory);
    expect_contains(e.what(), "1:0 (emulated:h100-sxm)");
    expect_contains(e.what(), "3.0 GiB");
    expect_contains(e.what(), "1.0 MiB");
  }
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.peak_bytes(), 0u);
  // Close to the 64-bit limit: no wrap-around lets it through.
  EXPECT_THROW(a.reserve(~std::uint64_t{0}), device_error);
  a.reserve(1);
  EXPECT_THROW(a.reserve(~std::uint64_t{0}), device_error);
  EXPECT_EQ(a.used_bytes(), 1u);
}

// ---------------------------------------------------------------------------
// memory_binding: tensors allocated on a bound thread are charged

TEST(devices_memory_binding, charges_tensors_until_freed) {
  auto a = account("0:0", 1u << 30);
  ASSERT_EQ(current_account(), nullptr);
  {
    memory_binding bind(a);
    EXPECT_EQ(current_account(), a);
    at::Tensor t = at::empty({1000}, at::kFloat);
    EXPECT_EQ(storage_bytes(t), 4000u);
    EXPECT_EQ(a->used_bytes(), 4000u);
    at::Tensor u = at::empty({10, 10}, at::kDouble);
    EXPECT_EQ(a->used_bytes(), 4800u);
    at::Tensor view = t.narrow(0, 10, 5); // shares t's storage
    EXPECT_EQ(storage_bytes(view), 4000u);
    EXPECT_EQ(a->used_bytes(), 4800u);
    t.reset();
    EXPECT_EQ(a->used_bytes(), 4800u); // the view keeps the storage
    view.reset();
    EXPECT_EQ(a->used_bytes(), 800u);
    u.reset();
    EXPECT_EQ(a->used_bytes(), 0u);
  }
  EXPECT_EQ(current_account(), nullptr);
  EXPECT_EQ(a->peak_bytes(), 4800u);
}

TEST(devices_memory_binding, unbound_threads_are_not_charged) {
  auto a = account("0:0", 1u << 30);
  at::Tensor kept;
  {
    memory_binding bind(a); // installs the allocator, binds this thread
    std::thread other([&] {
      EXPECT_EQ(current_account(), nullptr);
      kept = at::empty({4096}, at::kFloat);
    });
    other.join();
    EXPECT_EQ(a->used_bytes(), 0u);
  }
  at::Tensor after = at::empty({4096}, at::kFloat); // this thread unbound
  EXPECT_EQ(a->used_bytes(), 0u);
  kept.reset();
  after.reset();
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(a->peak_bytes(), 0u);
}

TEST(devices_memory_binding, freed_on_another_thread_is_released) {
  auto a = account("0:0", 1u << 30);
  at::Tensor t;
  {
    memory_binding bind(a);
    t = at::empty({256}, at::kFloat);
  }
  ASSERT_EQ(a->used_bytes(), 1024u);
  std::thread other([t = std::move(t)]() mutable { t.reset(); });
  other.join();
  EXPECT_EQ(a->used_bytes(), 0u);
}

TEST(devices_memory_binding, freed_on_a_thread_bound_elsewhere_credits_owner) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1", 1u << 30);
  at::Tensor t;
  {
    memory_binding bind(a);
    t = at::empty({100}, at::kFloat);
  }
  std::thread other([&] {
    memory_binding bind(b);
    t.reset();
  });
  other.join();
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(b->used_bytes(), 0u);
  EXPECT_EQ(b->peak_bytes(), 0u);
}

TEST(devices_memory_binding, nested_bindings_restore) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1", 1u << 30);
  ASSERT_EQ(current_account(), nullptr);
  {
    memory_binding outer(a);
    at::Tensor x = at::empty({10}, at::kFloat);
    {
      memory_binding inner(b);
      EXPECT_EQ(current_account(), b);
      at::Tensor y = at::empty({20}, at::kFloat);
      EXPECT_EQ(a->used_bytes(), 40u);
      EXPECT_EQ(b->used_bytes(), 80u);
    }
    EXPECT_EQ(current_account(), a);
    EXPECT_EQ(b->used_bytes(), 0u);
    at::Tensor z = at::empty({30}, at::kFloat);
    EXPECT_EQ(a->used_bytes(), 160u);
    EXPECT_EQ(b->peak_bytes(), 80u);
  }
  EXPECT_EQ(current_account(), nullptr);
  EXPECT_EQ(a->used_bytes(), 0u);
}

TEST(devices_memory_binding, allocation_over_capacity_fails_naming_the_chip) {
  auto a = account("0:2 (emulated:a100-sxm-40gb)", 16 * 1024);
  memory_binding bind(a);
  at::Tensor small = at::empty({1024}, at::kFloat); // 4 KiB of 16
  bool threw = false;
  try {
    at::Tensor big = at::empty({4096}, at::kFloat); // 16 KiB more
  } catch (const device_error& e) {
    threw = true;
    EXPECT_EQ(e.code(), device_errc::out_of_memory);
    expect_contains(e.what(), "0:2 (emulated:a100-sxm-40gb)");
  } catch (const c10::Error& e) {
    // libtorch may wrap errors thrown inside ops as its own type.
    threw = true;
    expect_contains(a->last_failure(), "0:2 (emulated:a100-sxm-40gb)");
  }
  EXPECT_TRUE(threw) << "an allocation past the capacity succeeded";
  expect_contains(a->last_failure(), "0:2 (emulated:a100-sxm-40gb)");
  expect_contains(a->last_failure(), "16.0 KiB");
  EXPECT_EQ(a->used_bytes(), 4096u); // nothing charged for the failure
  at::Tensor fits = at::empty({3072}, at::kFloat); // exactly the rest
  EXPECT_EQ(a->used_bytes(), 16u * 1024);
}

// ---------------------------------------------------------------------------
// adopt(): zero-copy hand-over between chips of one process

TEST(devices_memory_adopt, charges_receiver_until_the_alias_dies) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1", 1u << 30);
  at::Tensor original;
  {
    memory_binding bind(a);
    original = at::arange(256, at::kFloat);
  }
  ASSERT_EQ(a->used_bytes(), 1024u);
  at::Tensor alias = adopt(original, b);
  EXPECT_EQ(alias.data_ptr(), original.data_ptr()); // zero-copy
  EXPECT_TRUE(alias.equal(at::arange(256, at::kFloat)));
  EXPECT_EQ(b->used_bytes(), 1024u);
  EXPECT_EQ(a->used_bytes(), 1024u);

  original.reset(); // the alias keeps the original storage alive
  EXPECT_EQ(a->used_bytes(), 1024u);
  EXPECT_EQ(b->used_bytes(), 1024u);
  EXPECT_FLOAT_EQ(alias[255].item<float>(), 255.0f);

  at::Tensor view = alias.narrow(0, 0, 8); // shares the alias's storage
  alias.reset();
  EXPECT_EQ(b->used_bytes(), 1024u);
  view.reset();
  EXPECT_EQ(b->used_bytes(), 0u);
  EXPECT_EQ(a->used_bytes(), 0u);
}

TEST(devices_memory_adopt, original_outliving_the_alias_stays_charged) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1", 1u << 30);
  at::Tensor original;
  {
    memory_binding bind(a);
    original = at::ones({64}, at::kDouble);
  }
  {
    at::Tensor alias = adopt(original, b);
    EXPECT_EQ(b->used_bytes(), 512u);
  }
  EXPECT_EQ(b->used_bytes(), 0u);
  EXPECT_EQ(a->used_bytes(), 512u);
  original.reset();
  EXPECT_EQ(a->used_bytes(), 0u);
}

TEST(devices_memory_adopt, view_is_charged_its_whole_storage) {
  auto b = account("0:1", 1u << 30);
  at::Tensor base = at::arange(100, at::kFloat);
  at::Tensor view = base.narrow(0, 50, 10);
  at::Tensor alias = adopt(view, b);
  EXPECT_EQ(b->used_bytes(), 400u);
  EXPECT_EQ(alias.data_ptr(), view.data_ptr());
  EXPECT_TRUE(alias.equal(at::arange(50, 60, at::kFloat)));
}

TEST(devices_memory_adopt, too_large_for_the_receiver) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1 (emulated:mi250x)", 100);
  at::Tensor original;
  {
    memory_binding bind(a);
    original = at::empty({100}, at::kFloat);
  }
  try {
    adopt(original, b);
    FAIL() << "adopt() past the capacity succeeded";
  } catch (const device_error& e) {
    EXPECT_EQ(e.code(), device_errc::out_of_memory);
    expect_contains(e.what(), "0:1 (emulated:mi250x)");
  }
  EXPECT_EQ(b->used_bytes(), 0u);
  EXPECT_EQ(a->used_bytes(), 400u);
  original.reset();
  EXPECT_EQ(a->used_bytes(), 0u);
}

// ---------------------------------------------------------------------------
// move_charge(): a storage let go of for good changes account

TEST(devices_memory_move_charge, moves_whole_storage_and_only_from_one_holder) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1", 1u << 30);
  at::Tensor t;
  {
    memory_binding bind(a);
    t = at::arange(256, at::kFloat);
  }
  {
    at::Tensor view = t.narrow(0, 0, 8); // a second holder
    EXPECT_FALSE(move_charge(t, b));
    EXPECT_EQ(a->used_bytes(), 1024u);
    EXPECT_EQ(b->used_bytes(), 0u);
  }
  EXPECT_TRUE(move_charge(t, b));
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(b->used_bytes(), 1024u);
  EXPECT_EQ(charged_account(t), b.get());
  EXPECT_TRUE(move_charge(t, b)); // already b's: nothing changes
  EXPECT_EQ(b->used_bytes(), 1024u);
  t.reset();
  EXPECT_EQ(b->used_bytes(), 0u);
}

TEST(devices_memory_move_charge, unbound_and_adopted_storage_move_too) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1", 1u << 30);
  at::Tensor unbound = at::ones({16}, at::kDouble); // charged to nobody
  EXPECT_TRUE(move_charge(unbound, b));
  EXPECT_EQ(b->used_bytes(), 128u);
  at::Tensor alias = adopt(at::ones({8}, at::kFloat), a);
  EXPECT_EQ(a->used_bytes(), 32u);
  EXPECT_TRUE(move_charge(alias, b));
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(b->used_bytes(), 160u);
  alias.reset();
  unbound.reset();
  EXPECT_EQ(b->used_bytes(), 0u);
  // An alias of an original someone still holds is not the taker's alone.
  at::Tensor original = at::ones({8}, at::kFloat);
  at::Tensor shared = adopt(original, a);
  EXPECT_FALSE(move_charge(shared, b));
  EXPECT_EQ(a->used_bytes(), 32u);
  EXPECT_EQ(b->used_bytes(), 0u);
}

TEST(devices_memory_move_charge, let_go_it_is_charged_to_nobody_until_taken) {
  auto a = account("0:0", 1u << 30);
  auto b = account("0:1", 1u << 30);
  at::Tensor t, alias;
  {
    memory_binding bind(a);
    t = at::ones({64}, at::kFloat);
  }
  alias = adopt(at::ones({16}, at::kFloat), a);
  EXPECT_TRUE(move_charge(t, nullptr)); // the giver lets go before sending
  EXPECT_TRUE(move_charge(alias, nullptr));
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(charged_account(t), nullptr);
  EXPECT_TRUE(move_charge(t, b)); // the taker takes it
  EXPECT_EQ(b->used_bytes(), 256u);
  t.reset();
  alias.reset(); // freed charged to nobody
  EXPECT_EQ(a->used_bytes(), 0u);
  EXPECT_EQ(b->used_bytes(), 0u);
}

TEST(devices_memory_move_charge, foreign_memory_and_no_room_change_nothing) {
  auto a = account("0:0", 1u << 30);
  auto small = account("0:1 (emulated:mi250x)", 100);
  std::vector<float> outside(64, 1.0f); // not the accounting allocator's
  EXPECT_FALSE(move_charge(at::from_blob(outside.data(), {64}), small));
  EXPECT_FALSE(move_charge(at::Tensor(), small));
  at::Tensor t;
  {
    memory_binding bind(a);
    t = at::ones({64}, at::kFloat);
  }
  try {
    move_charge(t, small);
    FAIL() << "moved 256 bytes into an account of 100";
  } catch (const device_error& e) {
    EXPECT_EQ(e.code(), device_errc::out_of_memory);
  }
  EXPECT_EQ(a->used_bytes(), 256u);
  EXPECT_EQ(small->used_bytes(), 0u);
  EXPECT_EQ(charged_account(t), a.get());
}

TEST(devices_memory_adopt, undefined_tensor_passes_through) {
  auto b = account("0:1", 100);
  at::Tensor none;
  EXPECT_FALSE(adopt(none, b).defined());
  EXPECT_EQ(b->used_bytes(), 0u);
  EXPECT_EQ(storage_bytes(none), 0u);
}

// ---------------------------------------------------------------------------

TEST(devices_memory_binding, concurrent_threads_see_their_own_bytes) {
  constexpr int threads = 4;
  constexpr int rounds = 50;
  std::vector<std::shared_ptr<memory_account>> accounts;
  for (int i = 0; i < threads; ++i)
    accounts.push_back(account("0:" + std::to_string(i), 1u << 30));
  std::vector<std::uint64_t> seen_holding(threads * rounds);
  std::vector<std::uint64_t> seen_after(threads * rounds);
  std::barrier sync(threads);
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) {
    workers.emplace_back([&, i] {
      memory_binding bind(accounts[i]);
      for (int r = 0; r < rounds; ++r) {
        std::vector<at::Tensor> held;
        for (int k = 0; k <= i; ++k)
          held.push_back(at::empty({(i + 1) * 100 + r}, at::kFloat));
        sync.arrive_and_wait(); // every thread holds its tensors now
        seen_holding[i * rounds + r] = accounts[i]->used_bytes();
        sync.arrive_and_wait();
        held.clear();
        seen_after[i * rounds + r] = accounts[i]->used_bytes();
      }
    });
  }
  for (auto& w : workers)
    w.join();
  for (int i = 0; i < threads; ++i) {
    std::uint64_t max_expected = 0;
    for (int r = 0; r < rounds; ++r) {
      std::uint64_t expected =
        static_cast<std::uint64_t>(i + 1) * ((i + 1) * 100 + r) * 4;
      max_expected = std::max(max_expected, expected);
      EXPECT_EQ(seen_holding[i * rounds + r], expected) << i << "/" << r;
      EXPECT_EQ(seen_after[i * rounds + r], 0u) << i << "/" << r;
    }
    EXPECT_EQ(accounts[i]->used_bytes(), 0u);
    EXPECT_EQ(accounts[i]->peak_bytes(), max_expected);
  }
}

} // namespace
} // namespace h2::devices

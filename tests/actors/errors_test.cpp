// H2's errors across actor boundaries: the root cause of several chips'
// failures, and the round trip through caf::error.
#include "h2/actors/errors.hpp"

#include <gtest/gtest.h>

namespace h2::actors {
namespace {

TEST(actors_errors, root_cause_prefers_the_original_failure) {
  std::vector<failure> fs = {{errc::peer_lost, "peer gone"},
                             {errc::cancelled, "cancelled"},
                             {errc::out_of_memory, "chip 0:2 out of memory"},
                             {errc::peer_lost, "peer gone too"}};
  auto f = root_cause(fs);
  EXPECT_EQ(f.code, errc::out_of_memory);
  EXPECT_EQ(f.message, "chip 0:2 out of memory");
  auto e = make_error(errc::device_unavailable, "no cuda");
  auto back = to_failure(e);
  EXPECT_EQ(back.code, errc::device_unavailable);
  EXPECT_EQ(back.message, "no cuda");
}

} // namespace
} // namespace h2::actors

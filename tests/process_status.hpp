// What the tests read of a process from /proc.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace h2::test {

/// The number after `field` ("Threads:", "VmRSS:") in /proc/<pid>/status;
/// -1 once the process is gone.
inline long status_field(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0)
      return std::stol(line.substr(field.size()));
  return -1;
}

/// Threads of process `pid` now (-1 once it is gone).
inline int threads_of(pid_t pid) {
  return static_cast<int>(status_field(pid, "Threads:"));
}

/// Resident memory of process `pid` now, KiB (-1 once it is gone).
inline long rss_kib_of(pid_t pid) {
  return status_field(pid, "VmRSS:");
}

} // namespace h2::test

// What the tests read of a process from /proc.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace h2::test {

/// Threads of process `pid` now (/proc/<pid>/status; -1 once it is gone).
inline int threads_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0)
      return std::stoi(line.substr(8));
  return -1;
}

} // namespace h2::test

// Text from job files and peers, made safe for a terminal.
#pragma once

#include <string>
#include <string_view>

namespace h2 {

/// `text` with every control character (bytes 0x00-0x1f and 0x7f, among
/// them ESC, which starts terminal escape sequences) written as a C escape
/// ("\x1b"), so that a name from a job file or a
/// message from a peer prints as one line and cannot drive the terminal.
/// Other bytes (UTF-8 text included) pass unchanged.
std::string printable(std::string_view text);

} // namespace h2

// Writes a file so that a failure (full disk, bad path) leaves nothing behind: the content goes to
// `path.tmp`, which is flushed, checked and renamed over `path` only when complete.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace megactx {

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace megactx

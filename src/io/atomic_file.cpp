#include "io/atomic_file.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace megactx {

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
    const std::string tmp = path + ".tmp";
    std::error_code ec;
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        MEGACTX_CHECK(out.good(), "{}: cannot write", path);
        write(out);
        out.close();  // flushes: a full disk shows up here, not in the destructor
        if (!out.good()) {
            std::filesystem::remove(tmp, ec);
            MEGACTX_FAIL("{}: write failed", path);
        }
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        MEGACTX_FAIL("{}: cannot write", path);
    }
}

}  // namespace megactx

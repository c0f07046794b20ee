#include "io/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace megactx {

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
    std::string dims;
    int64_t n = 1;
    for (int64_t d : shape) {
        dims += std::to_string(d) + ", ";
        n *= d;
    }
    if (shape.size() > 1) dims.resize(dims.size() - 1);  // "(3, 4)" but "(3,)"
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64) header.push_back(' ');
    header.push_back('\n');
    write_file_atomically(path, [&](std::ostream& out) {
        const char magic[] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
        out.write(magic, 8);
        const auto len = static_cast<uint16_t>(header.size());
        const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
        out.write(len_bytes, 2);
        out.write(header.data(), static_cast<std::streamsize>(header.size()));
        out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
    });
}

NpyArray read_npy_f32(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    MEGACTX_CHECK(in.good(), "{}: cannot open", path);
    char magic[8];
    in.read(magic, 8);
    MEGACTX_CHECK(in.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not a .npy file", path);
    uint32_t header_len = 0;
    if (magic[6] == 1) {
        unsigned char b[2];
        in.read(reinterpret_cast<char*>(b), 2);
        header_len = b[0] | (b[1] << 8);
    } else {
        unsigned char b[4];
        in.read(reinterpret_cast<char*>(b), 4);
        header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
    }
    std::string header(header_len, '\0');
    in.read(header.data(), header_len);
    MEGACTX_CHECK(in.good(), "{}: truncated header", path);
    const bool f8 = header.find("'<f8'") != std::string::npos;
    MEGACTX_CHECK(f8 || header.find("'<f4'") != std::string::npos, "{}: expected float32 or float64 data", path);
    MEGACTX_CHECK(header.find("'fortran_order': False") != std::string::npos, "{}: expected C order", path);
    NpyArray a;
    const size_t l = header.find('('), r = header.find(')');
    MEGACTX_CHECK(l != std::string::npos && r != std::string::npos, "{}: no shape in header", path);
    std::stringstream ss(header.substr(l + 1, r - l - 1));
    std::string tok;
    int64_t n = 1;
    while (std::getline(ss, tok, ',')) {
        if (tok.find_first_not_of(' ') == std::string::npos) continue;
        a.shape.push_back(std::stoll(tok));
        n *= a.shape.back();
    }
    a.data.resize(static_cast<size_t>(n));
    if (f8) {
        std::vector<double> d(static_cast<size_t>(n));
        in.read(reinterpret_cast<char*>(d.data()), n * 8);
        for (int64_t i = 0; i < n; ++i) a.data[i] = static_cast<float>(d[i]);
    } else {
        in.read(reinterpret_cast<char*>(a.data.data()), n * 4);
    }
    MEGACTX_CHECK(in.good(), "{}: truncated data", path);
    return a;
}

}  // namespace megactx

// A PNG reader for the tests, written from the specification and independent of src/eval/png.cpp (bitwise CRC,
// plain Adler sums): parses the chunks, checks every CRC-32, the zlib header and Adler-32, inflates stored deflate
// blocks (the only kind the writer emits) and undoes filter 0. Fails the test with a message on any deviation.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace megactx::test {

struct DecodedPng {
    uint32_t width = 0, height = 0;
    std::vector<uint8_t> rgb;         // [height, width, 3]
    std::vector<std::string> chunks;  // chunk types in file order
};

inline uint32_t crc32_bitwise(const uint8_t* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

inline uint32_t adler32_plain(const std::vector<uint8_t>& d) {
    uint64_t a = 1, b = 0;
    for (uint8_t x : d) {
        a = (a + x) % 65521;
        b = (b + a) % 65521;
    }
    return static_cast<uint32_t>(b << 16 | a);
}

inline uint32_t be32(const std::vector<uint8_t>& b, size_t at) {
    return uint32_t{b[at]} << 24 | uint32_t{b[at + 1]} << 16 | uint32_t{b[at + 2]} << 8 | b[at + 3];
}

// Returns false (after ADD_FAILURE) on a malformed file.
inline bool decode_png(const std::vector<uint8_t>& f, DecodedPng* out) {
    static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (f.size() < 8 || !std::equal(kSig, kSig + 8, f.begin())) {
        ADD_FAILURE() << "no PNG signature";
        return false;
    }
    std::vector<uint8_t> idat;
    size_t at = 8;
    while (at < f.size()) {
        if (at + 12 > f.size()) {
            ADD_FAILURE() << "truncated chunk at " << at;
            return false;
        }
        const uint32_t n = be32(f, at);
        if (at + 12 + n > f.size()) {
            ADD_FAILURE() << "chunk length " << n << " runs past the file";
            return false;
        }
        const std::string type(f.begin() + static_cast<long>(at) + 4, f.begin() + static_cast<long>(at) + 8);
        const uint32_t crc = be32(f, at + 8 + n);
        if (crc32_bitwise(f.data() + at + 4, 4 + n) != crc) {
            ADD_FAILURE() << "bad CRC in chunk " << type;
            return false;
        }
        const std::vector<uint8_t> data(f.begin() + static_cast<long>(at) + 8,
                                        f.begin() + static_cast<long>(at + 8 + n));
        out->chunks.push_back(type);
        if (type == "IHDR") {
            out->width = be32(data, 0);
            out->height = be32(data, 4);
            if (n != 13 || data[8] != 8 || data[9] != 2 || data[10] != 0 || data[11] != 0 || data[12] != 0) {
                ADD_FAILURE() << "IHDR is not 8-bit RGB, deflate, filter 0, no interlace";
                return false;
            }
        } else if (type == "IDAT") {
            idat.insert(idat.end(), data.begin(), data.end());
        }
        at += 12 + n;
    }
    if (out->chunks.empty() || out->chunks.front() != "IHDR" || out->chunks.back() != "IEND") {
        ADD_FAILURE() << "chunks must start with IHDR and end with IEND";
        return false;
    }
    // zlib: CMF, FLG, stored deflate blocks, Adler-32
    if (idat.size() < 6 || (idat[0] & 0x0F) != 8 || ((idat[0] << 8) | idat[1]) % 31 != 0 || (idat[1] & 0x20)) {
        ADD_FAILURE() << "bad zlib header";
        return false;
    }
    std::vector<uint8_t> raw;
    size_t p = 2;
    for (bool last = false; !last;) {
        if (p + 5 > idat.size()) {
            ADD_FAILURE() << "truncated deflate block";
            return false;
        }
        last = idat[p] & 1;
        if (((idat[p] >> 1) & 3) != 0) {
            ADD_FAILURE() << "not a stored deflate block";
            return false;
        }
        const uint32_t len = idat[p + 1] | uint32_t{idat[p + 2]} << 8;
        const uint32_t nlen = idat[p + 3] | uint32_t{idat[p + 4]} << 8;
        if ((len ^ 0xFFFF) != nlen || p + 5 + len > idat.size()) {
            ADD_FAILURE() << "bad stored block length";
            return false;
        }
        raw.insert(raw.end(), idat.begin() + static_cast<long>(p) + 5, idat.begin() + static_cast<long>(p + 5 + len));
        p += 5 + len;
    }
    if (p + 4 != idat.size() || be32(idat, p) != adler32_plain(raw)) {
        ADD_FAILURE() << "bad Adler-32 or trailing bytes after the zlib stream";
        return false;
    }
    const size_t stride = 1 + 3 * size_t{out->width};
    if (raw.size() != stride * out->height) {
        ADD_FAILURE() << "image data is " << raw.size() << " bytes, expected " << stride * out->height;
        return false;
    }
    for (uint32_t y = 0; y < out->height; ++y) {
        if (raw[y * stride] != 0) {
            ADD_FAILURE() << "row " << y << " uses filter " << int{raw[y * stride]};
            return false;
        }
        out->rgb.insert(out->rgb.end(), raw.begin() + static_cast<long>(y * stride + 1),
                        raw.begin() + static_cast<long>((y + 1) * stride));
    }
    return true;
}

}  // namespace megactx::test

#include "eval/png.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "io/atomic_file.h"

namespace megactx {

Image::Image(int w, int h, Rgb fill) : width(w), height(h) {
    MEGACTX_CHECK(w > 0 && h > 0 && w <= 1 << 14 && h <= 1 << 14, "image size {}x{} is out of range", w, h);
    pixels.assign(static_cast<size_t>(w) * static_cast<size_t>(h), fill);
}

void Image::fill_rect(int x, int y, int w, int h, Rgb c) {
    const int x0 = std::max(x, 0), x1 = std::min(x + w, width);
    const int y0 = std::max(y, 0), y1 = std::min(y + h, height);
    for (int yy = y0; yy < y1; ++yy)
        for (int xx = x0; xx < x1; ++xx) at(xx, yy) = c;
}

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc) {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t n, uint32_t adler) {
    constexpr uint32_t kMod = 65521;
    uint32_t a = adler & 0xFFFF, b = adler >> 16;
    while (n > 0) {
        const size_t run = std::min<size_t>(n, 5552);  // the largest run before b can overflow 32 bits
        for (size_t i = 0; i < run; ++i) {
            a += data[i];
            b += a;
        }
        a %= kMod;
        b %= kMod;
        data += run;
        n -= run;
    }
    return (b << 16) | a;
}

namespace {

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// length, type, data, CRC-32 of type and data
void put_chunk(std::vector<uint8_t>& out, const char type[4], const std::vector<uint8_t>& data) {
    put_be32(out, static_cast<uint32_t>(data.size()));
    const size_t start = out.size();
    out.insert(out.end(), type, type + 4);
    out.insert(out.end(), data.begin(), data.end());
    put_be32(out, crc32(out.data() + start, out.size() - start));
}

}  // namespace

std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& data) {
    std::vector<uint8_t> out = {0x78, 0x01};  // deflate, 32 KiB window, no dictionary; (0x78 << 8 | 0x01) % 31 == 0
    size_t pos = 0;
    do {
        const size_t n = std::min<size_t>(data.size() - pos, 65535);
        const bool last = pos + n == data.size();
        out.push_back(last ? 1 : 0);  // BFINAL, BTYPE = 00 (stored), padded to the byte
        out.push_back(static_cast<uint8_t>(n));
        out.push_back(static_cast<uint8_t>(n >> 8));
        out.push_back(static_cast<uint8_t>(~n));
        out.push_back(static_cast<uint8_t>(~n >> 8));
        out.insert(out.end(), data.begin() + static_cast<long>(pos), data.begin() + static_cast<long>(pos + n));
        pos += n;
    } while (pos < data.size());
    put_be32(out, adler32(data.data(), data.size()));
    return out;
}

std::vector<uint8_t> encode_png(const Image& image) {
    std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    std::vector<uint8_t> ihdr;
    put_be32(ihdr, static_cast<uint32_t>(image.width));
    put_be32(ihdr, static_cast<uint32_t>(image.height));
    ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, colour type 2 (RGB), deflate, filter 0, no interlace
    put_chunk(out, "IHDR", ihdr);
    std::vector<uint8_t> raw;
    raw.reserve(static_cast<size_t>(image.height) * (1 + 3 * static_cast<size_t>(image.width)));
    for (int y = 0; y < image.height; ++y) {
        raw.push_back(0);  // filter type None
        for (int x = 0; x < image.width; ++x) {
            const Rgb& p = image.at(x, y);
            raw.insert(raw.end(), {p.r, p.g, p.b});
        }
    }
    put_chunk(out, "IDAT", zlib_stored(raw));
    put_chunk(out, "IEND", {});
    return out;
}

void write_png(const std::string& path, const Image& image) {
    const std::vector<uint8_t> bytes = encode_png(image);
    write_file_atomically(path, [&](std::ostream& os) {
        os.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    });
}

}  // namespace megactx

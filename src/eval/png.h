// A minimal PNG writer for the charts the CLI draws (`megactx eval niah --png`): 8-bit RGB, no interlace, each
// row with filter type 0, the zlib stream made of stored (uncompressed) deflate blocks, CRC-32 over every chunk
// and Adler-32 over the image data. Any PNG decoder reads it; no zlib or image library is needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megactx {

struct Rgb {
    uint8_t r = 0, g = 0, b = 0;
    bool operator==(const Rgb&) const = default;
};

// A width × height RGB canvas, rows top to bottom.
struct Image {
    int width = 0, height = 0;
    std::vector<Rgb> pixels;  // [height, width]

    Image(int w, int h, Rgb fill = {255, 255, 255});
    Rgb& at(int x, int y) {
        return pixels[static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)];
    }
    const Rgb& at(int x, int y) const {
        return pixels[static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)];
    }
    // Fills [x, x + w) × [y, y + h), clipped to the canvas.
    void fill_rect(int x, int y, int w, int h, Rgb c);
};

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);  // the PNG / zlib CRC (polynomial 0xEDB88320)
uint32_t adler32(const uint8_t* data, size_t n, uint32_t adler = 1);

// The zlib stream (RFC 1950) of `data` in stored deflate blocks (RFC 1951 §3.2.4) of at most 65535 bytes.
std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& data);

// The PNG file's bytes; write_png writes them to `path` atomically (nothing is left behind on failure).
std::vector<uint8_t> encode_png(const Image& image);
void write_png(const std::string& path, const Image& image);

}  // namespace megactx

// The PNG writer and the heatmap: files any decoder accepts (checked by an independent reader, and by `file` where
// installed), exact pixels, checksums against published values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "eval/heatmap.h"
#include "eval/png.h"
#include "png_decode.h"
#include "test_util.h"

namespace megactx {
namespace {

Image pattern(int w, int h) {
    Image img(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img.at(x, y) = {static_cast<uint8_t>(x * 7 + y), static_cast<uint8_t>(y * 13 + 5),
                            static_cast<uint8_t>(x ^ y)};
    return img;
}

void expect_round_trip(const Image& img) {
    test::DecodedPng d;
    ASSERT_TRUE(test::decode_png(encode_png(img), &d));
    EXPECT_EQ(d.width, static_cast<uint32_t>(img.width));
    EXPECT_EQ(d.height, static_cast<uint32_t>(img.height));
    ASSERT_EQ(d.rgb.size(), img.pixels.size() * 3);
    for (size_t i = 0; i < img.pixels.size(); ++i) {
        ASSERT_EQ(d.rgb[3 * i], img.pixels[i].r) << i;
        ASSERT_EQ(d.rgb[3 * i + 1], img.pixels[i].g) << i;
        ASSERT_EQ(d.rgb[3 * i + 2], img.pixels[i].b) << i;
    }
}

TEST(Png, ChecksumsMatchThePublishedCheckValues) {
    const std::string nine = "123456789";
    EXPECT_EQ(crc32(reinterpret_cast<const uint8_t*>(nine.data()), nine.size()), 0xCBF43926u);
    const std::string wiki = "Wikipedia";
    EXPECT_EQ(adler32(reinterpret_cast<const uint8_t*>(wiki.data()), wiki.size()), 0x11E60398u);
    // Adler-32 over more than one 5552-byte run of 0xFF (where a single sum would overflow) against the plain sums
    const std::vector<uint8_t> ff(100000, 0xFF);
    EXPECT_EQ(adler32(ff.data(), ff.size()), test::adler32_plain(ff));
}

TEST(Png, DecodesToTheSamePixels) {
    expect_round_trip(pattern(1, 1));
    expect_round_trip(pattern(37, 11));
    // 300 × 100 × 3 + 100 filter bytes = 90100 bytes: two stored blocks, the first exactly 65535 bytes
    expect_round_trip(pattern(300, 100));
}

TEST(Png, StoredBlocksSplitAt65535Bytes) {
    const std::vector<uint8_t> data(65535 * 2 + 10, 0xAB);
    const std::vector<uint8_t> z = zlib_stored(data);
    EXPECT_EQ(z.size(), 2 + 3 * 5 + data.size() + 4);
    EXPECT_EQ(z[2], 0);  // first block: not final, stored
    EXPECT_EQ(z[2 + 5 + 65535], 0);
    EXPECT_EQ(z[2 + 2 * (5 + 65535)], 1);  // last block: final
    const std::vector<uint8_t> empty = zlib_stored({});
    EXPECT_EQ(empty, (std::vector<uint8_t>{0x78, 0x01, 0x01, 0x00, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x01}));
}

TEST(Png, FileRecognisesTheImage) {
    test::TempDir dir;
    const std::string path = dir / "p.png";
    write_png(path, pattern(64, 48));
    test::DecodedPng d;
    ASSERT_TRUE(test::decode_png(test::read_bytes(path), &d));
    if (std::system("command -v file > /dev/null 2>&1") != 0) GTEST_SKIP() << "no `file` command here";
    const std::string out = dir / "file.txt";
    ASSERT_EQ(std::system(("file '" + path + "' > '" + out + "'").c_str()), 0);
    test::expect_contains(test::read_text(out), {"PNG image data, 64 x 48, 8-bit/color RGB, non-interlaced"});
}

TEST(Png, HeatColoursRunRedYellowGreen) {
    const Rgb red = heat_colour(0), yellow = heat_colour(0.5), green = heat_colour(1);
    EXPECT_GT(red.r, 200);
    EXPECT_LT(red.g, 80);
    EXPECT_GT(yellow.r, 200);
    EXPECT_GT(yellow.g, 200);
    EXPECT_LT(green.r, 80);
    EXPECT_GT(green.g, 140);
    EXPECT_EQ(heat_colour(-1), red);  // clamped
    EXPECT_EQ(heat_colour(2), green);
    const Rgb quarter = heat_colour(0.25);  // halfway between red and yellow
    EXPECT_NEAR(quarter.g, (red.g + yellow.g) / 2.0, 1.0);
}

TEST(Png, TextIsDrawnWithTheBuiltInFont) {
    EXPECT_EQ(text_width("", 1), 0);
    EXPECT_EQ(text_width("1", 1), 5);
    EXPECT_EQ(text_width("100%", 2), (4 * 6 - 1) * 2);
    Image img(40, 10);
    draw_text(img, 1, 1, "1", 1, {0, 0, 0});
    // '1' is "..#.." / ".##.." / "..#.." ... / ".###.": column 2 is inked on every row, column 0 on none
    for (int row = 0; row < 7; ++row) {
        EXPECT_EQ(img.at(1 + 2, 1 + row), (Rgb{0, 0, 0})) << row;
        EXPECT_EQ(img.at(1 + 0, 1 + row), (Rgb{255, 255, 255})) << row;
    }
    Image a(20, 10), b(20, 10);
    draw_text(a, 0, 0, "k", 1, {0, 0, 0});
    draw_text(b, 0, 0, "K", 1, {0, 0, 0});
    EXPECT_EQ(a.pixels, b.pixels);  // lower case is drawn as upper case
}

// Every cell is filled with its value's colour; a missing value (NaN) is grey; the image decodes.
TEST(Png, HeatmapCellsCarryTheirColours) {
    Heatmap h;
    h.title = "NIAH TEST";
    h.x_title = "CONTEXT LENGTH";
    h.y_title = "DEPTH";
    h.x_labels = {"1K", "2K", "1M"};
    h.y_labels = {"0", "0.5", "1"};
    h.values = {{0.0, 0.2, 0.4}, {0.6, 0.8, 1.0}, {std::nan(""), 0.5, 0.0}};
    const Image img = render_heatmap(h);
    const auto count = [&](Rgb c) {
        size_t n = 0;
        for (const Rgb& p : img.pixels) n += p == c;
        return n;
    };
    const size_t red = count(heat_colour(0.0));
    for (double v : {0.2, 0.4, 0.6, 0.8, 1.0, 0.5}) EXPECT_GT(count(heat_colour(v)), 500u) << v;
    EXPECT_GT(red, 2 * 500u);  // two cells at 0
    EXPECT_GT(count(Rgb{200, 200, 200}), 500u);
    expect_round_trip(img);
    h.values.pop_back();
    EXPECT_NE(test::error_of([&] { render_heatmap(h); }).find("rows of values"), std::string::npos);
}

}  // namespace
}  // namespace megactx

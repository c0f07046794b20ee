#include "eval/heatmap.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace megactx {

namespace {

constexpr int kGlyphW = 5, kGlyphH = 7;

struct Glyph {
    char c;
    std::array<const char*, kGlyphH> rows;
};

// '#' = ink. Upper case and digits in the classic 5×7 dot-matrix shapes.
constexpr Glyph kFont[] = {
    {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
    {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
    {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
    {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
    {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
    {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
    {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
    {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
    {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
    {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
    {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
    {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
    {'D', {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."}},
    {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
    {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
    {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
    {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
    {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
    {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
    {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
    {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
    {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
    {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
    {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
    {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
    {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
    {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
    {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
    {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
    {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
    {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
    {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
    {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
    {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
    {';', {".....", ".##..", ".##..", ".....", ".##..", "..#..", ".#..."}},
    {'-', {".....", ".....", ".....", "#####", ".....", ".....", "....."}},
    {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
    {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
    {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
    {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
    {'[', {".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###."}},
    {']', {".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###."}},
    {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
    {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
    {'*', {".....", "#.#.#", ".###.", "#####", ".###.", "#.#.#", "....."}},
    {'\'', {"..#..", "..#..", ".#...", ".....", ".....", ".....", "....."}},
    {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
};

const Glyph& glyph(char c) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    for (const Glyph& g : kFont)
        if (g.c == c) return g;
    return glyph('?');
}

Rgb mix(Rgb a, Rgb b, double t) {
    const auto lerp = [t](uint8_t x, uint8_t y) {
        return static_cast<uint8_t>(std::lround(x + (static_cast<double>(y) - x) * t));
    };
    return {lerp(a.r, b.r), lerp(a.g, b.g), lerp(a.b, b.b)};
}

// One glyph per byte: a UTF-8 character of several bytes draws as one '?' (its continuation bytes are skipped).
std::string printable(const std::string& text) {
    std::string out;
    for (unsigned char c : text) {
        if ((c & 0xC0) == 0x80) continue;
        out += c < 0x80 ? static_cast<char>(c) : '?';
    }
    return out;
}

}  // namespace

int text_width(const std::string& text, int scale) {
    const auto n = static_cast<int>(printable(text).size());
    return n == 0 ? 0 : (n * (kGlyphW + 1) - 1) * scale;
}

void draw_text(Image& image, int x, int y, const std::string& text, int scale, Rgb colour) {
    for (char c : printable(text)) {
        const Glyph& g = glyph(c);
        for (int row = 0; row < kGlyphH; ++row)
            for (int col = 0; col < kGlyphW; ++col)
                if (g.rows[static_cast<size_t>(row)][col] == '#')
                    image.fill_rect(x + col * scale, y + row * scale, scale, scale, colour);
        x += (kGlyphW + 1) * scale;
    }
}

Rgb heat_colour(double v) {
    constexpr Rgb kRed{215, 48, 39}, kYellow{250, 220, 70}, kGreen{40, 160, 70};
    v = std::clamp(v, 0.0, 1.0);
    return v < 0.5 ? mix(kRed, kYellow, v / 0.5) : mix(kYellow, kGreen, (v - 0.5) / 0.5);
}

Image render_heatmap(const Heatmap& h) {
    const size_t n_x = h.x_labels.size(), n_y = h.y_labels.size();
    MEGACTX_CHECK(n_x > 0 && n_y > 0 && h.values.size() == n_y, "heatmap: {} rows of values for {} labels",
                  h.values.size(), n_y);
    for (const auto& row : h.values)
        MEGACTX_CHECK(row.size() == n_x, "heatmap: a row of {} values for {} columns", row.size(), n_x);
    constexpr int kScale = 2, kLine = (kGlyphH + 4) * kScale, kMargin = 16, kPad = 10;
    constexpr Rgb kInk{30, 30, 30}, kNoData{200, 200, 200}, kGrid{255, 255, 255};
    int label_w = text_width(h.y_title, kScale);
    for (const auto& l : h.y_labels) label_w = std::max(label_w, text_width(l, kScale));
    int cell_w = text_width("100%", kScale) + 2 * kPad;
    for (const auto& l : h.x_labels) cell_w = std::max(cell_w, text_width(l, kScale) + 2 * kPad);
    const int cell_h = kGlyphH * kScale + 2 * kPad + 6;
    const int grid_x = kMargin + label_w + kPad, grid_y = kMargin + 3 * kLine;
    const int grid_w = cell_w * static_cast<int>(n_x), grid_h = cell_h * static_cast<int>(n_y);
    const int x_title_w = text_width(h.x_title, kScale);
    const int x_title_x = std::max(kMargin, grid_x + (grid_w - x_title_w) / 2);
    const int width = std::max(
        {grid_x + grid_w + kMargin, kMargin + text_width(h.title, kScale) + kMargin, x_title_x + x_title_w + kMargin});
    const int height = grid_y + grid_h + 2 * kLine + kMargin;
    Image img(width, height);

    draw_text(img, kMargin, kMargin, h.title, kScale, kInk);
    draw_text(img, kMargin + label_w - text_width(h.y_title, kScale), grid_y - kLine, h.y_title, kScale, kInk);
    for (size_t y = 0; y < n_y; ++y) {
        const int cy = grid_y + static_cast<int>(y) * cell_h;
        const int ty = cy + (cell_h - kGlyphH * kScale) / 2;
        draw_text(img, kMargin + label_w - text_width(h.y_labels[y], kScale), ty, h.y_labels[y], kScale, kInk);
        for (size_t x = 0; x < n_x; ++x) {
            const int cx = grid_x + static_cast<int>(x) * cell_w;
            const double v = h.values[y][x];
            img.fill_rect(cx, cy, cell_w, cell_h, std::isnan(v) ? kNoData : heat_colour(v));
            if (!std::isnan(v)) {
                char text[16];
                std::snprintf(text, sizeof text, "%.0f%%", 100.0 * std::clamp(v, 0.0, 1.0));
                draw_text(img, cx + (cell_w - text_width(text, kScale)) / 2, ty, text, kScale, kInk);
            }
        }
    }
    for (size_t x = 0; x <= n_x; ++x)  // white lines between the cells
        img.fill_rect(grid_x + static_cast<int>(x) * cell_w - 1, grid_y, 2, grid_h, kGrid);
    for (size_t y = 0; y <= n_y; ++y)
        img.fill_rect(grid_x, grid_y + static_cast<int>(y) * cell_h - 1, grid_w, 2, kGrid);
    const int lx = grid_y + grid_h + kPad;
    for (size_t x = 0; x < n_x; ++x) {
        const int cx = grid_x + static_cast<int>(x) * cell_w;
        draw_text(img, cx + (cell_w - text_width(h.x_labels[x], kScale)) / 2, lx, h.x_labels[x], kScale, kInk);
    }
    draw_text(img, x_title_x, lx + kLine, h.x_title, kScale, kInk);
    return img;
}

}  // namespace megactx

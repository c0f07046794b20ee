// A labelled heatmap drawn into an Image (eval/png.h) with a built-in 5×7 bitmap font: one cell per (x, y)
// with its value as a percentage, coloured from red (0) through yellow (0.5) to green (1).
#pragma once

#include <string>
#include <vector>

#include "eval/png.h"

namespace megactx {

struct Heatmap {
    std::string title;
    std::string x_title, y_title;
    std::vector<std::string> x_labels;        // columns, left to right
    std::vector<std::string> y_labels;        // rows, top to bottom
    std::vector<std::vector<double>> values;  // [y][x] in [0, 1]; NaN: no data (grey, no text)
};

// The font covers digits, A–Z (lowercase is drawn as uppercase), space and % . , : ; - _ / ( ) = + ? ' [ ] *;
// any other character is drawn as '?'.
int text_width(const std::string& text, int scale);
void draw_text(Image& image, int x, int y, const std::string& text, int scale, Rgb colour);

// Red → yellow → green for v in [0, 1] (clamped).
Rgb heat_colour(double v);

Image render_heatmap(const Heatmap& h);

}  // namespace megactx

// Draws a simulated step (simulator.hpp) as an SVG pipeline timeline: one
// row per chip, forward, backward, all-reduce and optimizer as coloured
// bars over a light-grey idle background, a time axis and a legend.
#pragma once

#include "h2/scheduler/simulator.hpp"

#include <string>
#include <vector>

namespace h2::scheduler {

/// The SVG document of `sim`, which must hold its timeline (simulate(...,
/// true)). `labels[r][s]` names the row of stage s of replica r (e.g.
/// "0:1 mi250x"); `title` heads the drawing. Text is XML-escaped.
std::string render_svg(const simulation& sim,
                       const std::vector<std::vector<std::string>>& labels,
                       const std::string& title);

} // namespace h2::scheduler

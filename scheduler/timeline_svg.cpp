#include "h2/scheduler/timeline_svg.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace h2::scheduler {

namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

const char* colour(interval_kind k) {
  switch (k) {
    case interval_kind::forward:
      return "#4e79a7";
    case interval_kind::backward:
      return "#f28e2b";
    case interval_kind::backward_input:
      return "#e15759";
    case interval_kind::backward_weight:
      return "#edc948";
    case interval_kind::wait:
      return "#d9d9d9";
    case interval_kind::allreduce:
      return "#b07aa1";
    case interval_kind::optimizer:
      return "#59a14f";
  }
  return "#000000";
}

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

/// A readable tick step for `span` seconds: 1, 2 or 5 times a power of 10.
double tick_step(double span) {
  double raw = span / 8;
  double p = 1;
  while (p * 10 <= raw)
    p *= 10;
  while (p > raw)
    p /= 10;
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (p * f >= raw)
      return p * f;
  return p * 10;
}

std::string time_text(double s, double step) {
  char buf[32];
  if (step >= 1)
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (step >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.0f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  return buf;
}

/// The legend under the title: a swatch and a name per interval kind,
/// from x = `left`.
void write_svg_legend(std::ostream& out, double left) {
  double lx = left;
  for (auto [name, kind] :
       {std::pair{"forward", interval_kind::forward},
        std::pair{"backward", interval_kind::backward},
        std::pair{"B (input)", interval_kind::backward_input},
        std::pair{"W (weight)", interval_kind::backward_weight},
        std::pair{"idle", interval_kind::wait},
        std::pair{"all-reduce", interval_kind::allreduce},
        std::pair{"optimizer", interval_kind::optimizer}}) {
    out << "<rect x=\"" << number(lx) << "\" y=\"28\" width=\"12\" "
        << "height=\"12\" fill=\"" << colour(kind) << "\"/>"
        << "<text x=\"" << number(lx + 16) << "\" y=\"38\">" << name
        << "</text>\n";
    lx += 100;
  }
}

/// Every interval but idle time (the rows' background shows it) as a bar
/// in its row, labelled with its micro-batch where it is wide enough;
/// `x_of` maps seconds to x and `row_of` (replica, stage) to the row.
template <class XOf, class RowOf>
void write_svg_intervals(std::ostream& out, const simulation& sim, double top,
                         double row_h, const XOf& x_of, const RowOf& row_of) {
  bool chunked = false; // does some chip hold a chunk other than its own?
  for (const auto& iv : sim.timeline)
    chunked = chunked || (iv.chunk >= 0 && iv.chunk != iv.stage);
  for (const auto& iv : sim.timeline) {
    if (iv.kind == interval_kind::wait)
      continue; // the background already shows idle time
    double y = top + row_h * row_of(iv.replica, iv.stage);
    double x0 = x_of(iv.start_seconds), x1 = x_of(iv.end_seconds);
    out << "<rect x=\"" << number(x0) << "\" y=\"" << number(y + 3)
        << "\" width=\"" << number(std::max(0.5, x1 - x0)) << "\" height=\""
        << number(row_h - 6) << "\" fill=\"" << colour(iv.kind)
        << "\" stroke=\"white\" stroke-width=\"0.5\"><title>"
        << to_string(iv.kind);
    if (iv.micro_batch >= 0)
      out << " " << iv.micro_batch;
    if (iv.chunk >= 0)
      out << " (chunk " << iv.chunk << ")";
    out << "</title></rect>\n";
    // Micro-batches as labels; with several chunks per chip "c.i" (chunk c,
    // micro-batch i).
    const std::string label = iv.micro_batch < 0 ? ""
                              : chunked ? std::to_string(iv.chunk) + "." +
                                            std::to_string(iv.micro_batch)
                                        : std::to_string(iv.micro_batch);
    if (!label.empty() && x1 - x0 >= 7.0 * static_cast<double>(label.size()))
      out << "<text x=\"" << number((x0 + x1) / 2) << "\" y=\""
          << number(y + 15) << "\" fill=\"white\" text-anchor=\"middle\" "
          << "font-size=\"9\">" << label << "</text>\n";
  }
}

} // namespace

std::string render_svg(const simulation& sim,
                       const std::vector<std::vector<std::string>>& labels,
                       const std::string& title) {
  H2_ENFORCE(labels.size() == sim.replicas.size(), "labels for ", labels.size(),
             " replicas, simulation has ", sim.replicas.size());
  // Rows in replica, then stage order; replica r's first row is first[r].
  std::vector<std::pair<int, int>> rows;
  std::vector<std::size_t> first;
  for (std::size_t r = 0; r < sim.replicas.size(); ++r) {
    H2_ENFORCE(labels[r].size() == sim.replicas[r].size(), "replica ", r, ": ",
               labels[r].size(), " labels for ", sim.replicas[r].size(),
               " stages");
    first.push_back(rows.size());
    for (std::size_t s = 0; s < sim.replicas[r].size(); ++s)
      rows.emplace_back(static_cast<int>(r), static_cast<int>(s));
  }
  const double label_w = 170, width = 1100, row_h = 22, top = 56, left = 10;
  const double plot_w = width - label_w - 2 * left;
  const double span = sim.step_seconds > 0 ? sim.step_seconds : 1;
  const double height = top + row_h * static_cast<double>(rows.size()) + 40;
  auto x_of = [&](double t) {
    return left + label_w + plot_w * t / span;
  };
  auto row_of = [&](int r, int s) {
    H2_ENFORCE(r >= 0 && static_cast<std::size_t>(r) < first.size() && s >= 0 &&
                 static_cast<std::size_t>(s) <
                   sim.replicas[static_cast<std::size_t>(r)].size(),
               "interval of replica ", r, " stage ", s, " outside the plan");
    return static_cast<double>(first[static_cast<std::size_t>(r)] +
                               static_cast<std::size_t>(s));
  };
  std::ostringstream out;
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << number(width)
      << "\" height=\"" << number(height) << "\" viewBox=\"0 0 "
      << number(width) << " " << number(height)
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << number(left) << "\" y=\"18\" font-size=\"14\">"
      << escape(title) << "</text>\n";
  write_svg_legend(out, left);
  // Rows: label, idle background, then every interval.
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto [r, s] = rows[i];
    double y = top + row_h * static_cast<double>(i);
    out << "<text x=\"" << number(left) << "\" y=\"" << number(y + 15) << "\">"
        << escape(
             labels[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)])
        << "</text>\n"
        << "<rect x=\"" << number(x_of(0)) << "\" y=\"" << number(y + 3)
        << "\" width=\"" << number(plot_w) << "\" height=\""
        << number(row_h - 6) << "\" fill=\"" << colour(interval_kind::wait)
        << "\"/>\n";
  }
  write_svg_intervals(out, sim, top, row_h, x_of, row_of);
  // Time axis.
  const double axis_y = top + row_h * static_cast<double>(rows.size()) + 6;
  out << "<line x1=\"" << number(x_of(0)) << "\" y1=\"" << number(axis_y)
      << "\" x2=\"" << number(x_of(span)) << "\" y2=\"" << number(axis_y)
      << "\" stroke=\"black\"/>\n";
  const double step = tick_step(span);
  for (double t = 0; t <= span * (1 + 1e-9); t += step)
    out << "<line x1=\"" << number(x_of(t)) << "\" y1=\"" << number(axis_y)
        << "\" x2=\"" << number(x_of(t)) << "\" y2=\"" << number(axis_y + 4)
        << "\" stroke=\"black\"/><text x=\"" << number(x_of(t)) << "\" y=\""
        << number(axis_y + 16) << "\" text-anchor=\"middle\">"
        << time_text(t, step) << "</text>\n";
  out << "</svg>\n";
  return out.str();
}

} // namespace h2::scheduler

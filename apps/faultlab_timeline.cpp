// faultlab's timeline picture (apps/faultlab.hpp): tokens or steps over
// time for the reference and the faulted run, the faults marked. Plain SVG,
// readable in any browser.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "apps/faultlab.hpp"

namespace corolla::app {

namespace {

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

void write_timeline_svg(const std::filesystem::path& dir, const std::string& title, const std::string& unit,
                        const faultlab_run& reference, const faultlab_run& faulted) {
  constexpr double W = 900, H = 420, left = 60, right = 20, top = 40, bottom = 50;
  // The picture spans the tokens (steps) and faults, not the processes'
  // start-up and teardown around them.
  double t_max = 1e-3;
  for (const faultlab_run* r : {&reference, &faulted})
    if (!r->progress_s.empty()) t_max = std::max(t_max, r->progress_s.back());
  for (const fault_timeline& f : faulted.faults) t_max = std::max(t_max, f.injected_at_s);
  // Starting the processes takes most of a short run: the picture starts a
  // little before the first token (step) or fault instead of at 0.
  double t_min = t_max;
  for (const faultlab_run* r : {&reference, &faulted})
    if (!r->progress_s.empty()) t_min = std::min(t_min, r->progress_s.front());
  for (const fault_timeline& f : faulted.faults)
    if (f.injected_at_s >= 0) t_min = std::min(t_min, f.injected_at_s);
  const double pad = 0.05 * (t_max - t_min);
  t_min = std::max(0.0, t_min - pad);
  t_max += pad;
  if (t_max - t_min < 1e-3) t_min = 0;
  std::size_t n_max = std::max<std::size_t>({reference.progress_s.size(), faulted.progress_s.size(), 1});
  const auto x = [&](double t) { return left + (W - left - right) * (std::max(t, t_min) - t_min) / (t_max - t_min); };
  const auto y = [&](double n) { return H - bottom - (H - top - bottom) * n / static_cast<double>(n_max); };
  std::ofstream svg(dir / "timeline.svg");
  char buf[256];
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << left << "\" y=\"22\" font-size=\"15\">" << escaped(title) << ": " << unit
      << " over time</text>\n";
  // Axes with a few ticks.
  std::snprintf(buf, sizeof buf, "<path d=\"M%.1f %.1f V%.1f H%.1f\" stroke=\"black\" fill=\"none\"/>\n", left, top,
                H - bottom, W - right);
  svg << buf;
  for (int i = 0; i <= 5; ++i) {
    const double t = t_min + (t_max - t_min) * i / 5, n = static_cast<double>(n_max) * i / 5;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.2f s</text>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n",
                  x(t), H - bottom + 18, t, left - 6, y(n) + 4, n);
    svg << buf;
  }
  svg << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 10
      << "\" text-anchor=\"middle\">seconds after the run started its processes</text>\n";
  // One line per run: the count of tokens (steps) reached at each time.
  const auto line = [&](const faultlab_run& r, const char* colour, const char* name, double legend_y) {
    std::string d = "M" + std::to_string(x(t_min)) + " " + std::to_string(y(0));
    for (std::size_t i = 0; i < r.progress_s.size(); ++i)
      d += " H" + std::to_string(x(r.progress_s[i])) + " V" + std::to_string(y(static_cast<double>(i + 1)));
    svg << "<path d=\"" << d << "\" stroke=\"" << colour << "\" stroke-width=\"2\" fill=\"none\"/>\n";
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"3\" fill=\"%s\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\">%s (%zu %s, %.1f s)</text>\n",
                  left + 12, legend_y - 4, colour, left + 32, legend_y, name, r.progress_s.size(), unit.c_str(),
                  r.seconds);
    svg << buf;
  };
  line(reference, "#999999", "reference", top + 14);
  line(faulted, "#1f5fbf", "with faults", top + 32);
  // Faults: a red line where injected, a green dot where the run went on.
  int row = 0;
  for (const fault_timeline& f : faulted.faults) {
    if (f.injected_at_s < 0) continue;
    const double fx = x(f.injected_at_s);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" stroke-dasharray=\"4 3\"/>\n",
                  fx, top, fx, H - bottom);
    svg << buf;
    const std::string label = f.what + " " + (f.hit.empty() ? f.target : f.hit);
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#c0392b\">", fx + 3, top + 54 + 14.0 * (row++ % 6));
    svg << buf << escaped(label) << "</text>\n";
    if (f.recovered_at_s >= 0) {
      const auto n = static_cast<double>(
          std::upper_bound(faulted.progress_s.begin(), faulted.progress_s.end(), f.recovered_at_s) -
          faulted.progress_s.begin());
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#27ae60\"/>\n", x(f.recovered_at_s),
                    y(n));
      svg << buf;
    }
  }
  svg << "</svg>\n";
}

}  // namespace corolla::app

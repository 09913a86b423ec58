#include "api/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace corolla::api {
namespace {

bool valid_name(const std::string& n) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

/// A sample value as Prometheus writes it (integers without a fraction).
std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string label_text(const metric_labels& labels, const std::string& extra_name = {}, const std::string& extra_value = {}) {
  std::string s;
  for (const auto& [k, v] : labels) s += (s.empty() ? "" : ",") + k + "=\"" + escape_label_value(v) + "\"";
  if (!extra_name.empty()) s += (s.empty() ? "" : ",") + extra_name + "=\"" + extra_value + "\"";
  return s.empty() ? s : "{" + s + "}";
}

}  // namespace

std::string escape_label_value(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void metrics_registry::declare(const std::string& name, kind k, const std::string& help, std::vector<double> buckets) {
  if (!valid_name(name)) throw std::invalid_argument("invalid metric name '" + name + "'");
  if (k == kind::histogram && (buckets.empty() || !std::is_sorted(buckets.begin(), buckets.end()) ||
                               std::adjacent_find(buckets.begin(), buckets.end()) != buckets.end()))
    throw std::invalid_argument("histogram " + name + " needs increasing bucket bounds");
  std::lock_guard lock(mutex_);
  if (families_.count(name)) return;
  family f;
  f.k = k;
  f.help = help;
  f.buckets = std::move(buckets);
  families_.emplace(name, std::move(f));
}

metrics_registry::family& metrics_registry::get(const std::string& name, kind k) {
  auto it = families_.find(name);
  if (it == families_.end()) throw std::invalid_argument("metric " + name + " was not declared");
  if (it->second.k != k && !(k == kind::counter && it->second.k == kind::gauge))
    throw std::invalid_argument("metric " + name + " is of another kind");
  return it->second;
}

void metrics_registry::add(const std::string& name, const metric_labels& labels, double value) {
  std::lock_guard lock(mutex_);
  family& f = get(name, kind::counter);
  if (f.k == kind::counter && value < 0) throw std::invalid_argument("counter " + name + " cannot go down");
  f.series_by_labels[labels].value += value;
}

void metrics_registry::set(const std::string& name, const metric_labels& labels, double value) {
  std::lock_guard lock(mutex_);
  get(name, kind::gauge).series_by_labels[labels].value = value;
}

void metrics_registry::set_total(const std::string& name, const metric_labels& labels, double value) {
  std::lock_guard lock(mutex_);
  family& f = get(name, kind::counter);
  if (f.k != kind::counter) throw std::invalid_argument("metric " + name + " is not a counter");
  // Two scrapes may read the count in one order and set it in the other:
  // a counter keeps the larger.
  double& v = f.series_by_labels[labels].value;
  v = std::max(v, value);
}

void metrics_registry::observe(const std::string& name, const metric_labels& labels, double value) {
  std::lock_guard lock(mutex_);
  family& f = get(name, kind::histogram);
  series& s = f.series_by_labels[labels];
  if (s.bucket_counts.empty()) s.bucket_counts.assign(f.buckets.size(), 0.0);
  const auto at = std::lower_bound(f.buckets.begin(), f.buckets.end(), value) - f.buckets.begin();
  if (static_cast<std::size_t>(at) < s.bucket_counts.size()) s.bucket_counts[static_cast<std::size_t>(at)] += 1;
  s.sum += value;
  s.count += 1;
}

void metrics_registry::set_histogram(const std::string& name, const metric_labels& labels,
                                     const std::vector<double>& bucket_counts, double sum, double count) {
  std::lock_guard lock(mutex_);
  family& f = get(name, kind::histogram);
  if (bucket_counts.size() < f.buckets.size())
    throw std::invalid_argument("histogram " + name + " has " + std::to_string(f.buckets.size()) + " buckets, given " +
                                std::to_string(bucket_counts.size()) + " counts");
  series& s = f.series_by_labels[labels];
  s.bucket_counts.assign(bucket_counts.begin(), bucket_counts.begin() + static_cast<std::ptrdiff_t>(f.buckets.size()));
  s.sum = sum;
  s.count = count;
}

double metrics_registry::value(const std::string& name, const metric_labels& labels) const {
  std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0.0;
  auto s = it->second.series_by_labels.find(labels);
  if (s == it->second.series_by_labels.end()) return 0.0;
  return it->second.k == kind::histogram ? s->second.count : s->second.value;
}

std::string metrics_registry::render() const { return render({}); }

std::string metrics_registry::render(const std::function<bool(const metric_labels&)>& hidden) const {
  const auto shown = [&](const metric_labels& labels) { return !hidden || !hidden(labels); };
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " ";
    for (char c : f.help) out += c == '\n' ? std::string("\\n") : c == '\\' ? std::string("\\\\") : std::string(1, c);
    out += "\n# TYPE " + name + " " +
           (f.k == kind::counter ? "counter" : f.k == kind::gauge ? "gauge" : "histogram") + "\n";
    if (f.k != kind::histogram) {
      // A family without series (or none shown) shows its zero, so
      // dashboards see it, and a hidden series' first count changes
      // nothing a scraper sees.
      bool any = false;
      for (const auto& [labels, s] : f.series_by_labels)
        if (shown(labels)) {
          out += name + label_text(labels) + " " + number(s.value) + "\n";
          any = true;
        }
      if (!any) out += name + " 0\n";
      continue;
    }
    for (const auto& [labels, s] : f.series_by_labels) {
      if (!shown(labels)) continue;
      double cumulative = 0;
      for (std::size_t b = 0; b < f.buckets.size(); ++b) {
        cumulative += s.bucket_counts[b];
        out += name + "_bucket" + label_text(labels, "le", number(f.buckets[b])) + " " + number(cumulative) + "\n";
      }
      out += name + "_bucket" + label_text(labels, "le", "+Inf") + " " + number(s.count) + "\n";
      out += name + "_sum" + label_text(labels) + " " + number(s.sum) + "\n";
      out += name + "_count" + label_text(labels) + " " + number(s.count) + "\n";
    }
  }
  return out;
}

}  // namespace corolla::api
